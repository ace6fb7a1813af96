/* Admission: move from plan P to P* only when
 *     (T(P) - T(P*)) * H > C(P -> P*) * (1 + margin),
 * the saving is at least min_gain of the step, and the last transition is at
 * least `hysteresis` steps old. A plan that no longer fits is left at once.
 * A change of micro-batches only (a re-tune) moves nothing and costs nothing:
 * its saving, at least min_gain, admits it. */
#include <stdio.h>
#include <string.h>

#include "nereus/policy.h"

enum { RING = 64 };

void nrs_admission_init(nrs_admission_t *a, const nrs_spec_t *s)
{
    memset(a, 0, sizeof(*a));
    a->p = s->policy;
    a->total_steps = s->workload.steps;
    a->last_transition_step = -1;
}

void nrs_admission_note_change(nrs_admission_t *a, int step)
{
    a->change_steps[a->nchanges % RING] = step;
    a->nchanges++;
}

void nrs_admission_note_transition(nrs_admission_t *a, int step)
{
    a->last_transition_step = step;
}

double nrs_admission_horizon(const nrs_admission_t *a, int step)
{
    double left = a->total_steps - step, h = left;
    if (a->p.horizon > 0) {
        h = a->p.horizon;
    } else if (a->nchanges >= 2) {
        int n = a->nchanges < RING ? a->nchanges : RING;
        int newest = a->change_steps[(a->nchanges - 1) % RING];
        int oldest = a->change_steps[(a->nchanges - n) % RING];
        h = (double)(newest - oldest) / (n - 1);
        if (h < 1)
            h = 1;
    }
    if (h > left)
        h = left;
    return h > 0 ? h : 0;
}

/* Both decisions: retune, a change of micro-batches only, costs nothing and
 * is no transition (no hysteresis). */
static void decide(const nrs_admission_t *a, int step, double cur_step_s, double cand_step_s,
                   double cost_s, bool retune, nrs_decision_t *d)
{
    memset(d, 0, sizeof(*d));
    d->horizon_steps = nrs_admission_horizon(a, step);
    d->cost_s = cost_s;
    d->margin = a->p.margin;
    d->retune = retune;
    if (cur_step_s == NRS_POLICY_INFEASIBLE) {
        d->admit = d->forced = true;
        if (retune)
            snprintf(d->why, sizeof(d->why), "forced: the current plan no longer fits; a re-tune "
                     "of micro-batches only: nothing moves, no cost");
        else
            snprintf(d->why, sizeof(d->why),
                     "forced: the current plan no longer fits; moving costs %.3f s", cost_s);
        return;
    }
    d->saving_s = cur_step_s - cand_step_s;
    double gain = cur_step_s > 0 ? d->saving_s / cur_step_s : 0;
    double value = d->saving_s * d->horizon_steps, price = cost_s * (1 + a->p.margin);
    if (!retune && a->last_transition_step >= 0 &&
        step - a->last_transition_step < a->p.hysteresis) {
        snprintf(d->why, sizeof(d->why),
                 "rejected: last transition %d steps ago (hysteresis %d); saving %.3f s/step",
                 step - a->last_transition_step, a->p.hysteresis, d->saving_s);
        return;
    }
    if (gain < a->p.min_gain) {
        snprintf(d->why, sizeof(d->why), "rejected%s: gain %.2f%% below min_gain %.2f%%",
                 retune ? " (a re-tune of micro-batches only)" : "", gain * 100,
                 a->p.min_gain * 100);
        return;
    }
    if (retune) {
        d->admit = d->saving_s > 0;
        snprintf(d->why, sizeof(d->why), "%s: a re-tune of micro-batches only, saving %.3f s/step "
                 "(%.2f%%) at no cost: nothing moves", d->admit ? "admitted" : "rejected",
                 d->saving_s, gain * 100);
        return;
    }
    d->admit = value > price;
    snprintf(d->why, sizeof(d->why),
             "%s: saving %.3f s/step x horizon %.0f steps = %.3f s %s cost %.3f s x (1 + margin %.2f) = %.3f s",
             d->admit ? "admitted" : "rejected", d->saving_s, d->horizon_steps, value,
             d->admit ? ">" : "<=", cost_s, a->p.margin, price);
}

void nrs_admission_decide(const nrs_admission_t *a, int step, double cur_step_s,
                          double cand_step_s, double cost_s, nrs_decision_t *d)
{
    decide(a, step, cur_step_s, cand_step_s, cost_s, false, d);
}

void nrs_admission_decide_retune(const nrs_admission_t *a, int step, double cur_step_s,
                                 double cand_step_s, nrs_decision_t *d)
{
    decide(a, step, cur_step_s, cand_step_s, 0, true, d);
}
