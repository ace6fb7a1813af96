/* libFuzzer target for the control protocol: (1) every decoder on arbitrary
 * payload bytes must return 0 or -NRS_PERR_MALFORMED and, on success, a value
 * that re-encodes; (2) the controller's frame state machine (conn + ctl, no
 * sockets) fed the same bytes as a stream from three peers, split where the
 * input says, with the clock moving — it must never crash, leak or hang, and
 * must keep its own invariants. ASan/UBSan catch the rest. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/ctl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char spec_yaml[] =
    "cluster: {gpu: x, gpu_mem_gib: 16, peak_tflops: 1, hbm_gbps: 50, gpus_per_node: 4,\n"
    "          nodes: 1, intra_gbps: 10, inter_gbps: 1, host_gbps: 10}\n"
    "models:\n"
    "  actor: {layers: 4, hidden: 256, ffn: 1024, heads: 8, kv_heads: 2, vocab: 4096, dtype: fp32}\n"
    "  critic: {layers: 2, hidden: 256, ffn: 1024, heads: 8, kv_heads: 2, vocab: 4096, dtype: fp32}\n"
    "  ref: {layers: 4, hidden: 256, ffn: 1024, heads: 8, kv_heads: 2, vocab: 4096, dtype: fp32}\n"
    "  reward: {layers: 2, hidden: 128, ffn: 512, heads: 4, kv_heads: 1, vocab: 4096}\n"
    "algorithm: {name: ppo}\n"
    "workload: {global_batch: 8, prompt_len: 32, response_len: 32, max_response_len: 64,\n"
    "           steps: 20, micro_batch_max: 4}\n"
    "policy: {hysteresis: 2}\n"
    "runtime: {transports: [local], mem_headroom_gib: 0.5, emulation_scale: 1}\n";

static nrs_spec_t spec;
static int spec_ok = -1;

static void decoders(const uint8_t *p, size_t n)
{
    static nrs_msg_plan_t plan;
    static nrs_msg_delta_t delta;
    static uint8_t out[NRS_PROTO_HDR + NRS_PROTO_MAX_PAYLOAD];
    char why[128];
    nrs_msg_hello_t hello;
    nrs_msg_report_t rep;
    nrs_msg_delta_reply_t dr;
    nrs_msg_status_req_t sq;
    nrs_msg_epoch_t em;
    nrs_msg_ack_t ack;
    nrs_msg_error_t er;
    const char *t;
    size_t tl;
    int rc;
#define CHECK(call, reenc)                                                                         \
    do {                                                                                           \
        rc = (call);                                                                               \
        if (rc != 0 && rc != -NRS_PERR_MALFORMED)                                                  \
            abort();                                                                               \
        if (rc == 0 && (reenc) < 0)                                                                \
            abort(); /* what we accept, we can say */                                              \
    } while (0)
    CHECK(nrs_dec_hello(p, n, &hello, why, sizeof(why)), nrs_enc_hello(out, sizeof(out), &hello));
    CHECK(nrs_dec_plan(p, n, &plan, why, sizeof(why)), nrs_enc_plan(out, sizeof(out), &plan));
    CHECK(nrs_dec_report(p, n, &rep, why, sizeof(why)), nrs_enc_report(out, sizeof(out), &rep));
    CHECK(nrs_dec_delta(p, n, &delta, why, sizeof(why)), nrs_enc_delta(out, sizeof(out), &delta));
    CHECK(nrs_dec_delta_reply(p, n, &dr, why, sizeof(why)),
          nrs_enc_delta_reply(out, sizeof(out), &dr));
    CHECK(nrs_dec_status_req(p, n, &sq, why, sizeof(why)), nrs_enc_status_req(out, sizeof(out), &sq));
    CHECK(nrs_dec_status(p, n, &t, &tl, why, sizeof(why)), nrs_enc_status(out, sizeof(out), t, tl, 0));
    for (uint16_t ty = NRS_MSG_PREPARE; ty <= NRS_MSG_ABORT; ty++)
        if (ty != NRS_MSG_ACK)
            CHECK(nrs_dec_epoch(ty, p, n, &em, why, sizeof(why)), nrs_enc_epoch(out, sizeof(out), ty, &em));
    CHECK(nrs_dec_ack(p, n, &ack, why, sizeof(why)), nrs_enc_ack(out, sizeof(out), &ack));
    CHECK(nrs_dec_error(p, n, &er, why, sizeof(why)), nrs_enc_error(out, sizeof(out), &er));
    static nrs_msg_world_t wo;
    CHECK(nrs_dec_world(p, n, &wo, why, sizeof(why)), nrs_enc_world(out, sizeof(out), &wo));
    static nrs_msg_gather_t ga;
    CHECK(nrs_dec_gather(p, n, &ga, why, sizeof(why)), nrs_enc_gather(out, sizeof(out), &ga));
    nrs_msg_gathered_t gd;
    rc = nrs_dec_gathered(p, n, &gd, why, sizeof(why));
    if (rc != 0 && rc != -NRS_PERR_MALFORMED)
        abort();
    for (uint32_t i = 0; rc == 0 && i < gd.count; i++) {
        int32_t rk;
        const uint8_t *d;
        nrs_gathered_entry(&gd, i, &rk, &d);
        if (rk < 0 || d < p || d + gd.len > p + n)
            abort(); /* entries stay inside the payload */
    }
#undef CHECK
}

/* The stream: the first bytes pick peers and cut sizes; frames the input
 * carries are fed as they come, and valid-looking headers are rewritten so the
 * fuzzer reaches the message handlers, not only the magic check. */
static void state_machine(const uint8_t *data, size_t size)
{
    nrs_ctl_opts_t o;
    nrs_ctl_t *c;
    char err[NRS_ERR_MAX];
    nrs_conn_t *k[3];
    double now = 10;
    if (spec_ok != 0)
        return;
    nrs_ctl_opts_init(&o, &spec);
    o.secret = "fuzz-secret-0123456789";
    o.max_gpus = 32; /* every decision prices a transition graph: keep them small */
    if (nrs_ctl_new(&c, &o, now, err, sizeof(err)) != 0)
        abort();
    for (int i = 0; i < 3; i++) {
        k[i] = nrs_conn_new(-1, now);
        k[i]->tcp = i == 2;
        if (nrs_ctl_attach(c, k[i], now) != 0)
            abort();
    }
    size_t off = 0;
    while (off + 2 <= size) {
        uint8_t sel = data[off], cut = data[off + 1];
        off += 2;
        int who = sel % 3;
        size_t n = (size_t)cut + 1;
        if (n > size - off)
            n = size - off;
        if (sel & 0x80) { /* frame the chunk: a valid header around fuzz bytes */
            uint8_t *f = malloc(NRS_PROTO_HDR + n);
            uint16_t ty = (uint16_t)(1 + (sel >> 3) % NRS_MSG_MAX);
            nrs_proto_hdr_encode(f, ty, 0, (uint32_t)n);
            memcpy(f + NRS_PROTO_HDR, data + off, n);
            size_t fo = 0;
            while (fo < NRS_PROTO_HDR + n && k[who]->state < NRS_CONN_CLOSING) {
                size_t t = nrs_conn_feed(k[who], f + fo, NRS_PROTO_HDR + n - fo, now);
                nrs_ctl_input(c, k[who], now);
                if (t == 0)
                    break;
                fo += t;
            }
            free(f);
        } else {
            size_t t = nrs_conn_feed(k[who], data + off, n, now);
            (void)t;
            nrs_ctl_input(c, k[who], now);
        }
        off += n;
        if (sel & 0x40) {
            now += (sel & 0x3f) * 0.5;
            nrs_ctl_tick(c, now);
        }
        for (int i = 0; i < 3; i++) {
            if (k[i]->out_len - k[i]->out_off > NRS_CONN_OUT_MAX ||
                k[i]->out_shared > NRS_CONN_SHARED_MAX || k[i]->nrefs > NRS_CONN_REFS_MAX)
                abort();
            nrs_conn_clear_out(k[i]);
            if (k[i]->state >= NRS_CONN_CLOSING) { /* the loop would close it: reconnect */
                nrs_ctl_detach(c, k[i], now);
                nrs_conn_free(k[i]);
                k[i] = nrs_conn_new(-1, now);
                k[i]->tcp = i == 2;
                if (nrs_ctl_attach(c, k[i], now) != 0)
                    abort();
            }
        }
        if (nrs_ctl_pending_epoch(c) && nrs_ctl_pending_epoch(c) <= nrs_ctl_epoch(c))
            abort(); /* epochs only grow */
    }
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        nrs_ctl_status(c, true, now, devnull);
        nrs_ctl_status(c, false, now, devnull);
        fclose(devnull);
    }
    for (int i = 0; i < 3; i++) {
        nrs_ctl_detach(c, k[i], now);
        nrs_conn_free(k[i]);
    }
    nrs_ctl_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[NRS_ERR_MAX];
    if (spec_ok < 0)
        spec_ok = nrs_spec_load_buffer("fuzz-spec", spec_yaml, sizeof(spec_yaml) - 1, &spec, err,
                                       sizeof(err));
    if (spec_ok != 0) {
        fprintf(stderr, "fuzz_proto: built-in spec: %s\n", err);
        abort();
    }
    if (size > NRS_PROTO_HDR && size - NRS_PROTO_HDR <= NRS_PROTO_MAX_PAYLOAD)
        decoders(data + NRS_PROTO_HDR, size - NRS_PROTO_HDR);
    state_machine(data, size);
    return 0;
}
