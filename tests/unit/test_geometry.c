/* Shard geometry against hand-worked cases (Llama-3-8B dims: hidden 4096, 32
 * heads of 128, 8 kv heads, ffn 14336, vocab 128256, 32 layers). Rows of qkv are
 * [q (4096) | k (1024) | v (1024)]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "emu/geometry.h"
#include "fixtures.h"

static nrs_model_t m8b;
static nrs_emu_tbox_t boxes[4096];

/* Tensor ids of this file: globals as they are, layer l's tensor lt as
 * LAYER(l, lt); of_tensor turns the latter into layer l's part of the stacked
 * tensor, in the layer's own coordinates (nrs_emu_layer_part). */
#define LAYER(l, lt) (1000 * ((l) + 1) + (lt))

/* The boxes rank (p, t) holds of one tensor, in order. */
static int of_tensor(int tp, int pp, int p, int t, int tensor, nrs_emu_rect_t *out, int max)
{
    int n = nrs_emu_rank_boxes(&m8b, tp, pp, p, t, boxes, 4096), k = 0;
    int layer = tensor / 1000 - 1, want = layer < 0 ? tensor : NRS_EMU_T_GLOBALS + tensor % 1000;
    assert_true(n > 0 && n < 4096);
    for (int i = 0; i < n; i++) {
        nrs_emu_rect_t in, local;
        if (boxes[i].tensor != want || k >= max)
            continue;
        if (layer < 0)
            out[k++] = boxes[i].box;
        else if (nrs_emu_layer_part(&m8b, want, &boxes[i].box, layer, &in, &local))
            out[k++] = local;
    }
    return k;
}

static int layer_tensor(int layer, int lt)
{
    return LAYER(layer, lt);
}

static void expect(nrs_emu_rect_t r, int r0, int r1, int c0, int c1)
{
    if (r.r0 != r0 || r.r1 != r1 || r.c0 != c0 || r.c1 != c1)
        fail_msg("box rows [%d,%d) cols [%d,%d), want rows [%d,%d) cols [%d,%d)", r.r0, r.r1, r.c0,
                 r.c1, r0, r1, c0, c1);
}

static int setup(void **st)
{
    (void)st;
    set_model(&m8b, 32, 4096, 14336, 32, 8, 128256, false);
    return 0;
}

/* tp 4 and tp 2: column-parallel q, k, v (2 and 4 kv heads per rank), gate,
 * up; row-parallel o and down; vocab-parallel embedding and head; replicated norms. */
static void test_tp4_and_tp2(void **st)
{
    (void)st;
    nrs_emu_rect_t r[4];
    assert_int_equal(of_tensor(4, 1, 0, 1, layer_tensor(0, NRS_EMU_LT_QKV), r, 4), 3);
    expect(r[0], 1024, 2048, 0, 4096);         /* q heads 8..15 */
    expect(r[1], 4096 + 256, 4096 + 512, 0, 4096); /* k heads 2, 3 */
    expect(r[2], 5120 + 256, 5120 + 512, 0, 4096); /* v heads 2, 3 */
    assert_int_equal(of_tensor(4, 1, 0, 1, layer_tensor(5, NRS_EMU_LT_O), r, 4), 1);
    expect(r[0], 0, 4096, 1024, 2048);
    assert_int_equal(of_tensor(4, 1, 0, 1, layer_tensor(5, NRS_EMU_LT_GATE), r, 4), 1);
    expect(r[0], 3584, 7168, 0, 4096);
    assert_int_equal(of_tensor(4, 1, 0, 1, layer_tensor(5, NRS_EMU_LT_DOWN), r, 4), 1);
    expect(r[0], 0, 4096, 3584, 7168);
    assert_int_equal(of_tensor(4, 1, 0, 1, layer_tensor(5, NRS_EMU_LT_NORM1), r, 4), 1);
    expect(r[0], 0, 1, 0, 4096);
    assert_int_equal(of_tensor(4, 1, 0, 1, NRS_EMU_T_EMBED, r, 4), 1);
    expect(r[0], 32064, 64128, 0, 4096);
    assert_int_equal(of_tensor(4, 1, 0, 3, NRS_EMU_T_HEAD, r, 4), 1);
    expect(r[0], 96192, 128256, 0, 4096);
    /* tp 2, rank 1: the second half of everything. */
    assert_int_equal(of_tensor(2, 1, 0, 1, layer_tensor(0, NRS_EMU_LT_QKV), r, 4), 3);
    expect(r[0], 2048, 4096, 0, 4096);
    expect(r[1], 4096 + 512, 5120, 0, 4096);
    expect(r[2], 5120 + 512, 6144, 0, 4096);
    assert_int_equal(of_tensor(2, 1, 0, 1, layer_tensor(0, NRS_EMU_LT_UP), r, 4), 1);
    expect(r[0], 7168, 14336, 0, 4096);
}

/* pp 2 -> 4: balanced contiguous layer ranges, embedding on the first stage,
 * head and final norm on the last. */
static void test_pp2_and_pp4(void **st)
{
    (void)st;
    nrs_emu_rect_t r[4];
    for (int layer = 0; layer < 32; layer++) {
        int t = layer_tensor(layer, NRS_EMU_LT_GATE);
        assert_int_equal(of_tensor(1, 2, layer / 16, 0, t, r, 4), 1);
        assert_int_equal(of_tensor(1, 2, 1 - layer / 16, 0, t, r, 4), 0);
        assert_int_equal(of_tensor(1, 4, layer / 8, 0, t, r, 4), 1);
        assert_int_equal(of_tensor(1, 4, (layer / 8 + 1) % 4, 0, t, r, 4), 0);
    }
    assert_int_equal(of_tensor(1, 4, 0, 0, NRS_EMU_T_EMBED, r, 4), 1);
    assert_int_equal(of_tensor(1, 4, 1, 0, NRS_EMU_T_EMBED, r, 4), 0);
    assert_int_equal(of_tensor(1, 4, 3, 0, NRS_EMU_T_HEAD, r, 4), 1);
    assert_int_equal(of_tensor(1, 4, 3, 0, NRS_EMU_T_FINAL_NORM, r, 4), 1);
    assert_int_equal(of_tensor(1, 4, 2, 0, NRS_EMU_T_HEAD, r, 4), 0);
    /* 32 layers over pp 3: 11, 11, 10 (the first stages take the extra). */
    assert_int_equal(of_tensor(1, 3, 0, 0, layer_tensor(10, NRS_EMU_LT_O), r, 4), 1);
    assert_int_equal(of_tensor(1, 3, 1, 0, layer_tensor(11, NRS_EMU_LT_O), r, 4), 1);
    assert_int_equal(of_tensor(1, 3, 1, 0, layer_tensor(21, NRS_EMU_LT_O), r, 4), 1);
    assert_int_equal(of_tensor(1, 3, 2, 0, layer_tensor(22, NRS_EMU_LT_O), r, 4), 1);
}

/* 8 kv heads, tp 16: 2 q heads per rank; kv heads replicated Megatron-style,
 * rank t holding kv head t*8/16 = t/2. */
static void test_gqa_kv8_tp16(void **st)
{
    (void)st;
    nrs_emu_rect_t r[4];
    for (int t = 0; t < 16; t++) {
        int kv = t / 2;
        assert_int_equal(of_tensor(16, 1, 0, t, layer_tensor(3, NRS_EMU_LT_QKV), r, 4), 3);
        expect(r[0], 256 * t, 256 * (t + 1), 0, 4096);
        expect(r[1], 4096 + 128 * kv, 4096 + 128 * (kv + 1), 0, 4096);
        expect(r[2], 5120 + 128 * kv, 5120 + 128 * (kv + 1), 0, 4096);
    }
}

/* The stacked tensors themselves: pp 2, tp 4, stage 1, rank 1 holds layers
 * 16..31 of each layer tensor as one box (three for q|k|v). */
static void test_stacked_boxes(void **st)
{
    (void)st;
    int n = nrs_emu_rank_boxes(&m8b, 4, 2, 1, 1, boxes, 4096), H = 4096;
    int r, c, l0, l1;
    assert_int_equal(n, 3 + 6 + 2); /* q|k|v, o, gate, up, down, 2 norms; final norm, head */
    nrs_emu_tensor_shape(&m8b, NRS_EMU_T_GLOBALS + NRS_EMU_LT_QKV, &r, &c);
    assert_int_equal(r, 6144);
    assert_int_equal(c, 32 * H);
    expect(boxes[0].box, 1024, 2048, 16 * H, 32 * H); /* q heads 8..15, layers 16..31 */
    nrs_emu_box_layers(&m8b, boxes[0].tensor, &boxes[0].box, &l0, &l1);
    assert_int_equal(l0, 16);
    assert_int_equal(l1, 32);
    for (int i = 0; i < n; i++) {
        if (boxes[i].tensor == NRS_EMU_T_GLOBALS + NRS_EMU_LT_O)
            expect(boxes[i].box, 16 * H, 32 * H, 1024, 2048);
        if (boxes[i].tensor == NRS_EMU_T_GLOBALS + NRS_EMU_LT_DOWN)
            expect(boxes[i].box, 16 * H, 32 * H, 3584, 7168);
        if (boxes[i].tensor == NRS_EMU_T_GLOBALS + NRS_EMU_LT_NORM2)
            expect(boxes[i].box, 16, 32, 0, H);
    }
    /* a part of a layer: the box's columns of layer 20 only */
    nrs_emu_rect_t part = {1024, 2048, 20 * H + 100, 21 * H + 7}, in, local;
    assert_int_equal(nrs_emu_layer_part(&m8b, boxes[0].tensor, &part, 20, &in, &local), 1);
    expect(in, 1024, 2048, 20 * H + 100, 21 * H);
    expect(local, 1024, 2048, 100, H);
    assert_int_equal(nrs_emu_layer_part(&m8b, boxes[0].tensor, &part, 21, &in, &local), 1);
    expect(local, 1024, 2048, 0, 7);
    assert_int_equal(nrs_emu_layer_part(&m8b, boxes[0].tensor, &part, 22, &in, &local), 0);
    assert_int_equal(nrs_emu_layer_part(&m8b, NRS_EMU_T_EMBED, &part, 20, &in, &local), 0);
    nrs_emu_box_layers(&m8b, boxes[0].tensor, &part, &l0, &l1);
    assert_int_equal(l0, 20);
    assert_int_equal(l1, 22);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp4_and_tp2),
        cmocka_unit_test(test_pp2_and_pp4),
        cmocka_unit_test(test_gqa_kv8_tp16),
        cmocka_unit_test(test_stacked_boxes),
    };
    return cmocka_run_group_tests_name("geometry", tests, setup, NULL);
}
