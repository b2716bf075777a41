/* Calibrations in the meshplan database (the file of store/db.h, beside the planner's
 * tables of planner/store.h).
 *
 * Table `calibrations`, one row per measured figure, created on first save (CREATE TABLE
 * IF NOT EXISTS inside the saving transaction, so the planner's schema version does not
 * change and a planner that never reads calibrations opens the file as it is):
 *   id          the calibration (every row of one calibration shares it; ids increase)
 *   created_at  ISO 8601 UTC; device ("cpu"), host, threads (per rank), world (ranks)
 *   key         what the row holds:
 *                 gemm.<pass>.NxKxM                  FLOP/s, <pass> = fwd | dgrad | wgrad
 *                                                    | bwd (cpu: matmul_backward whole)
 *                 copy                               GB/s (read + write)
 *                 <coll>.time.<bytes>                s per call
 *                 <coll>.busbw.<bytes>               GB/s
 *                 <coll>.alpha                       s per ring step
 *                 <coll>.beta                        GB/s
 *               with <coll> = all_reduce | all_gather | reduce_scatter | all_to_all;
 *               the kernels (docs/calibration.md, "CUDA"): every cuda calibration, and a
 *               cpu one with a kernel fit (a cpu calibration of GEMM and copy only has
 *               none of these rows):
 *                 attn.fwd|bwd.BxTxNHxNKVxHD         FLOP/s (the simulator's count)
 *                 bw.<kernel>.<elements>             GB/s, <kernel> = rmsnorm_fwd |
 *                                                    rmsnorm_bwd | swiglu_fwd | swiglu_bwd |
 *                                                    adamw, and on the cpu also rope_fwd |
 *                                                    rope_bwd | ce_fwd | ce_bwd | residual
 *                 launch                             s per call of a kernel doing no work
 *                 ref.bf16_tflops, ref.fp8_tflops, ref.hbm_GBps   the figures the
 *                                                    efficiencies are relative to (cuda: the
 *                                                    datasheet's; cpu: the GEMM peak and the
 *                                                    copy that the CPU profile takes)
 *               cuda only:
 *                 f8gemm.<pass>.NxKxM                FLOP/s of matmul_f8 as the runtime
 *                                                    calls it, <pass> = fwd (E4M3 x E4M3)
 *                                                    | dgrad | wgrad (E5M2 x E4M3); a
 *                                                    calibration may hold fwd rows only
 *                 gpu.cc                             compute capability (90: sm_90)
 *                 fit.gemm_eff_max, fit.gemm_eff_half_mnk, fit.gemm_curve_rms,
 *                 fit.gemm_table_rms, fit.gemm_table (0/1), fit.fp8_gemm_eff_max,
 *                 fit.attention_eff, fit.hbm_eff, fit.kernel_overhead_us
 *                                                    the fit, as mp_calib_fit_stack left it
 *                                                    (0: not measured); cpu calibrations
 *                                                    with a fit hold these rows too
 *                 fit.fp8_gemm_curve_rms, fit.fp8_gemm_table_rms, fit.fp8_gemm_table (0/1)
 *                                                    the float8 by-shape check (absent: read
 *                                                    as 0, the float8 curve alone)
 *   group_size  ranks per group for collective rows, 1 otherwise
 *   value, unit
 * Table `calibration_notes`, created the same way: the text of a cuda calibration, one row
 * per note: id, key (gpu.name, gpu.profile, attn.unavailable, f8.unavailable), text.
 *
 * Compatibility: both tables are additive and every key keeps its meaning, so the schema
 * version never changes for them. A calibration lacking optional rows loads as what it
 * holds: a cpu one without kernel rows has no fit (the stack keeps its stated figures), a
 * cuda one with f8gemm.fwd rows only and no fit.fp8_gemm_* rows has the float8 curve
 * alone. A row or note whose key this build does not know makes the load refuse the whole
 * calibration ("a row this meshplan cannot read; recalibrate") rather than read half of
 * it. A calibration is one transaction: readers never see half of one.
 *
 * The file is opened and checked by mp_db_open (store/db.h; created with the planner's
 * schema when absent), so a corrupt or foreign file is MP_ERR_DB with the store's
 * message, and a file made by `meshplan calibrate` is a valid planner database. Its
 * connection has the file's settings (WAL, busy timeout MP_STORE_BUSY_TIMEOUT_MS); a save
 * takes the write lock with one BEGIN IMMEDIATE. */
#ifndef MP_CALIB_STORE_H
#define MP_CALIB_STORE_H

#include "common/status.h"
#include "calib/calibrate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the database as a save would (creating it when absent) and closes it: lets a
 * caller refuse an unusable --db before spending time measuring. */
mp_status mp_calib_store_check(mp_ctx *ctx, const char *db_path);

/* Saves c as a new calibration and sets c->id. */
mp_status mp_calib_store_save(mp_ctx *ctx, const char *db_path, mp_calib *c);

/* The newest calibration (largest id) of device. MP_ERR_NOT_FOUND when the file does not
 * exist or holds none for that device; MP_ERR_DB when it is not a meshplan database. */
mp_status mp_calib_store_load(mp_ctx *ctx, const char *db_path, const char *device, mp_calib *out);

#ifdef __cplusplus
}
#endif
#endif
