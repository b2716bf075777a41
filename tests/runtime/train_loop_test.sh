#!/usr/bin/env bash
# meshplan train's loop on one rank (no mpirun), end to end:
#   - resume is bit-identical: 20 steps straight == 10 steps, kill -9 (SIGKILL) at step 13,
#     --resume latest to 20: every loss (metrics JSONL, printed exactly by cJSON) and the
#     final checkpoint's shard bytes equal; dense, MoE, float8 (emulated) and float8 on
#     codes; with an LR schedule and shuffled data, so the schedule's and the loader's
#     positions are restored too
#   - kill -9 during a save, at each of its named points: the newest complete checkpoint
#     loads and the resumed run still ends bit-identical to the straight one
#   - corruption of a shard byte (first, middle, last), a truncated shard, a checkpoint of
#     another model or vocabulary: refused in one line naming the file and the tensor
#   - keep-K; divergence (--lr 1000 --clip 0) stops with exit 1 naming the step and keeps
#     the last good checkpoint, and the database says diverged / incomplete / complete;
#   - LR schedules in the metrics equal the formulas; token shards (uint16 and uint32, by
#     glob) train as the synthetic corpus does; ids beyond the vocabulary are refused;
#     export and report --plot run
set -u
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export OMP_NUM_THREADS=1
PY=/usr/bin/python3
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok   $1"; fi; }
common=(train --steps 20 --seq 16 --micro-batch 2 --global-batch 4 --quiet --lr 3e-3 --lr-schedule cosine
        --warmup 3 --min-lr 3e-4 --shuffle)

# same_losses A.jsonl B.jsonl: the steps of B are steps of A with the same loss, bit for bit,
# and B ends at A's last step
same_losses() {
  $PY - "$1" "$2" <<'EOF'
import json, sys
a = {}
for l in open(sys.argv[1]):
    o = json.loads(l); a[o["step"]] = (o["loss"], o["grad_norm"], o["lr"])
b = [json.loads(l) for l in open(sys.argv[2])]
bad = [o["step"] for o in b if a.get(o["step"]) != (o["loss"], o["grad_norm"], o["lr"])]
steps = [o["step"] for o in b]
ok = not bad and steps == sorted(set(steps)) and steps[-1] == max(a)
if not ok: print("  differing steps %s, steps %s" % (bad, steps))
sys.exit(0 if ok else 1)
EOF
}

# resume_case NAME ARGS...: straight 20 vs 10 + kill -9 at step 13 + resume
resume_case() {
  local name="$1"; shift
  local d="$tmp/$name"
  rm -rf "$d"; mkdir -p "$d"
  "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/a" --checkpoint-every 10 --metrics "$d/a.jsonl" >/dev/null 2>&1
  MESHPLAN_TEST_KILL=step:13 "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/b" --checkpoint-every 10 \
    --metrics "$d/b.jsonl" >/dev/null 2>&1
  local rc=$?
  check "$name: killed at step 13 (SIGKILL, rc 137)" "[ $rc -eq 137 ] && [ -d $d/b/step_00000010 ] && [ ! -d $d/b/step_00000020 ]"
  "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/b" --checkpoint-every 10 --metrics "$d/b.jsonl" \
    --resume latest >"$d/resume.out" 2>&1
  check "$name: resumed from step 10" "grep -q 'resumed from $d/b/step_00000010: step 10' $d/resume.out"
  check "$name: losses, grad norms and lr bit-identical, metrics steps 1..20 once" "same_losses $d/a.jsonl $d/b.jsonl"
  check "$name: final weights and moments bit-identical" "cmp -s $d/a/step_00000020/rank_00000.bin $d/b/step_00000020/rank_00000.bin"
}
resume_case dense --model tiny-dense
resume_case moe --model tiny-moe
resume_case fp8 --model tiny-dense --fp8
resume_case moe_ac --model tiny-moe --ac full

# kill -9 during the save of step 20 at each point: step 10 (or, after the rename, 20)
# stays loadable and the resumed run ends as the straight one
d="$tmp/dense"
for point in begin shard_half shards_written manifest_written renamed; do
  k="$tmp/kill_$point"
  rm -rf "$k"; mkdir -p "$k"
  MESHPLAN_TEST_KILL="save:$point:20" "$bin" "${common[@]}" --model tiny-dense --checkpoint-dir "$k/c" \
    --checkpoint-every 10 --metrics "$k/m.jsonl" >/dev/null 2>&1
  rc=$?
  latest=$(ls "$k/c" | grep '^step_' | tail -1)
  want=step_00000010; [ "$point" = renamed ] && want=step_00000020
  check "save killed at $point: rc 137, newest complete step is $want" "[ $rc -eq 137 ] && [ '$latest' = $want ]"
  "$bin" "${common[@]}" --model tiny-dense --checkpoint-dir "$k/c" --checkpoint-every 10 --metrics "$k/m.jsonl" \
    --resume latest >"$k/out" 2>&1
  check "save killed at $point: resumes and ends bit-identical" \
    "same_losses $d/a.jsonl $k/m.jsonl && cmp -s $d/a/step_00000020/rank_00000.bin $k/c/step_00000020/rank_00000.bin && [ ! -e $k/c/.tmp_step_00000020 ]"
done

# corruption: one flipped byte anywhere in a shard is found; the error names file and tensor
c="$tmp/corrupt"
size=$(stat -c %s "$d/a/step_00000020/rank_00000.bin")
for off in 0 $((size / 2)) $((size - 1)); do
  rm -rf "$c"; cp -r "$d/a/step_00000020" "$c"
  b=$(od -An -tu1 -j "$off" -N1 "$c/rank_00000.bin" | tr -d ' ')
  printf "$(printf '\\%03o' $(( (b + 1) % 256 )))" | dd of="$c/rank_00000.bin" bs=1 seek="$off" conv=notrunc status=none
  err=$("$bin" "${common[@]}" --model tiny-dense --resume "$c" 2>&1 >/dev/null); rc=$?
  check "byte $off flipped: refused in one line naming the file and tensor (exit 2)" \
    "[ $rc -eq 2 ] && [ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -q 'rank_00000.bin: tensor .*checksum mismatch'"
done
rm -rf "$c"; cp -r "$d/a/step_00000020" "$c"
truncate -s $((size - 100)) "$c/rank_00000.bin"
err=$("$bin" "${common[@]}" --model tiny-dense --resume "$c" 2>&1 >/dev/null); rc=$?
check "truncated shard refused naming file and tensor" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'rank_00000.bin: tensor .* truncated'"
err=$("$bin" "${common[@]}" --model tiny-moe --resume "$d/a" 2>&1 >/dev/null); rc=$?
check "another model's checkpoint refused naming it" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q \"manifest.json: the checkpoint's model tiny-dense has top_k = 0, model tiny-moe has 2\""
echo '{"name": "v512", "family": "llama", "vocab": 512, "d_model": 64, "n_layers": 2, "n_heads": 8,
 "n_kv_heads": 4, "head_dim": 8, "d_ff": 192, "max_seq": 64}' >"$tmp/v512.json"
err=$("$bin" "${common[@]}" --model "$tmp/v512.json" --resume "$d/a" 2>&1 >/dev/null); rc=$?
check "another vocabulary refused naming the tensor and both shapes" \
  "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'tensor tok_embeddings.weight has shape \[256, 64, 1\].*\[512, 64, 1\]'"

# --resume latest when the newest checkpoint is damaged: it is skipped with a line naming it
# and why, the newest one that loads is resumed (a restart loop goes on), and the run ends
# as the straight one; when none loads the refusal names the newest's reason. A checkpoint
# named explicitly still refuses (above).
f="$tmp/fallback"
rm -rf "$f"; mkdir -p "$f"; cp -r "$d/a/step_00000010" "$d/a/step_00000020" "$f/"
printf 'X' | dd of="$f/step_00000020/rank_00000.bin" bs=1 seek=100 conv=notrunc status=none
"$bin" "${common[@]}" --model tiny-dense --checkpoint-dir "$f" --checkpoint-every 10 --metrics "$f/m.jsonl" \
  --resume latest >"$f/out" 2>&1; rc=$?
check "newest checkpoint corrupt: skipped, naming it and the reason" \
  "[ $rc -eq 0 ] && grep -q '^resume: skipping $f/step_00000020: .*checksum mismatch' $f/out"
check "newest checkpoint corrupt: resumed from the one before, ending bit-identical" \
  "grep -q 'resumed from $f/step_00000010: step 10' $f/out && cmp -s $d/a/step_00000020/rank_00000.bin $f/step_00000020/rank_00000.bin"
truncate -s 100 "$f/step_00000010/rank_00000.bin" "$f/step_00000020/rank_00000.bin"
err=$("$bin" "${common[@]}" --model tiny-dense --checkpoint-dir "$f" --resume latest 2>&1 >/dev/null); rc=$?
check "no checkpoint loads: refused in one line with the newest's reason" \
  "[ $rc -eq 2 ] && [ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -q 'no checkpoint in $f loads; the newest: $f/step_00000020/.*truncated'"

# a run that fails before its first step leaves no file it created empty: neither the
# database (with the prediction it recorded) nor the metrics; a database that was there
# keeps its runs and marks this one failed
e="$tmp/early"
rm -rf "$e"; mkdir -p "$e/adir"
"$bin" train --model tiny-dense --steps 2 --db "$e/a.db" --metrics "$e/a.jsonl" --data "$e/none_*.bin" >/dev/null 2>&1
check "failed on its data: no .db and no metrics file left" "[ ! -e $e/a.db ] && [ ! -e $e/a.db-wal ] && [ ! -e $e/a.jsonl ]"
"$bin" train --model tiny-dense --steps 2 --seq 16 --db "$e/b.db" --metrics "$e/b.jsonl" --dump-logits "$e/adir" >/dev/null 2>&1
check "failed after opening them: no .db and no metrics file left" "[ ! -e $e/b.db ] && [ ! -e $e/b.jsonl ]"
"$bin" train --model tiny-dense --steps 2 --seq 16 --db "$e/c.db" --quiet >/dev/null 2>&1
"$bin" train --model tiny-dense --steps 2 --seq 16 --db "$e/c.db" --data "$e/none_*.bin" >/dev/null 2>&1
rep=$("$bin" report --db "$e/c.db")
check "a database that was there keeps its run; the failed one reads failed" \
  "echo \"\$rep\" | grep -Eq '^ +1 .* complete\$' && echo \"\$rep\" | grep -Eq '^ +2 .* failed\$'"

# keep-K: every 2 steps, keep 2
"$bin" "${common[@]}" --model tiny-dense --steps 10 --checkpoint-dir "$tmp/keep" --checkpoint-every 2 \
  --checkpoint-keep 2 >/dev/null 2>&1
check "keep 2: only steps 8 and 10 remain" "[ \"\$(ls $tmp/keep | tr '\n' ' ')\" = 'step_00000008 step_00000010 ' ]"

# divergence: exit 1, the step named, the last good checkpoint kept, the database's status
db="$tmp/runs.db"
"$bin" "${common[@]}" --model tiny-dense --steps 6 --db "$db" >/dev/null 2>&1
out=$("$bin" train --model tiny-dense --steps 30 --seq 16 --micro-batch 2 --global-batch 4 --lr 1000 --clip 0 \
      --checkpoint-dir "$tmp/div" --checkpoint-every 1 --db "$db" --quiet 2>&1); rc=$?
step=$(echo "$out" | sed -n 's/^meshplan train: step \([0-9]*\): .*diverged.*/\1/p')
check "--lr 1000 --clip 0 diverges: exit 1 and names the step" "[ $rc -eq 1 ] && [ -n '$step' ] && ! echo \"\$out\" | grep -q '^done'"
check "diverged: the last good checkpoint is the step before and is named" \
  "[ -d $tmp/div/step_\$(printf %08d \$((step - 1))) ] && echo \"\$out\" | grep -q \"last good checkpoint is $tmp/div/step_\$(printf %08d \$((step - 1)))\""
MESHPLAN_TEST_KILL=step:3 "$bin" "${common[@]}" --model tiny-dense --steps 6 --db "$db" >/dev/null 2>&1
rep=$("$bin" report --db "$db")
check "report: complete, diverged, incomplete" \
  "echo \"\$rep\" | grep -E '^ +1 .* complete\$' >/dev/null && echo \"\$rep\" | grep -E '^ +2 .* diverged\$' >/dev/null && echo \"\$rep\" | grep -E '^ +3 .* incomplete\$' >/dev/null"

# one training run keeps one history in the database across resumes: killed at step 5 with
# micro-batch 2, resumed from step 3 with micro-batch 1 (another plan of the same mesh),
# the second process records into the same run under its own plan, and report shows one
# curve of 8 steps with the resume marked
o="$tmp/onerun"
rm -rf "$o"; mkdir -p "$o"
orun=(train --model tiny-dense --steps 8 --seq 16 --global-batch 4 --quiet --checkpoint-dir "$o/ck" --checkpoint-every 3
      --db "$o/r.db")
MESHPLAN_TEST_KILL=step:5 "$bin" "${orun[@]}" --micro-batch 2 >/dev/null 2>&1
"$bin" "${orun[@]}" --micro-batch 1 --resume latest >/dev/null 2>&1
rep=$("$bin" report --db "$o/r.db" --run 1 2>&1)
echo "$rep" | tail -4
check "resumed with another plan: one run in the database" "[ \$(\"$bin\" report --db $o/r.db | grep -c 'tiny-dense') -eq 1 ]"
check "resumed with another plan: report shows the 8 steps and both segments, the resume marked" \
  "echo \"\$rep\" | grep -q '^training: 8 measured steps.*(complete)' && echo \"\$rep\" | grep -q 'one run across 2 processes' && echo \"\$rep\" | grep -Eq '^ +1 +1 +single +2 +1\.\.4\$' && echo \"\$rep\" | grep -Eq '^ +2 +2 +single +1 +4\.\.8, resumed from step 3\$'"

# the LR schedule as the metrics record it, against the formulas (lr.h)
"$bin" train --model tiny-dense --steps 20 --seq 16 --micro-batch 2 --global-batch 4 --quiet --lr 1e-2 \
  --lr-schedule wsd --warmup 4 --min-lr 1e-3 --decay-frac 0.25 --metrics "$tmp/wsd.jsonl" >/dev/null 2>&1
check "wsd lr per step equals the formula" "$PY - $tmp/wsd.jsonl <<'EOF'
import json, math, sys
lr, mn, W, S = 1e-2, 1e-3, 4, 20
D = S - round(0.25 * (S - W))          # 16: stable through step 16
def want(s):
    if s <= W: return lr * s / W
    if s <= D: return lr
    return mn + (lr - mn) * (1 - math.sqrt((s - D) / (S - D)))
got = [(o['step'], o['lr']) for o in map(json.loads, open(sys.argv[1]))]
sys.exit(0 if len(got) == 20 and all(abs(l - want(s)) <= 1e-7 * want(s) for s, l in got) else 1)
EOF"

# cosine and linear through the metrics, with 4 warmup steps over 20: p = (step - 4) / 16, so
# steps 8 and 16 are p = 0.25 and 0.75, where the two shapes (and a cosine mistaken for a
# line) differ: cosine 1e-3 + 9e-3 (1 + cos(pi p)) / 2 = 8.6820e-3 and 2.3180e-3, linear
# 1e-2 - 9e-3 p = 7.75e-3 and 3.25e-3
for kind in cosine linear; do
  "$bin" train --model tiny-dense --steps 20 --seq 16 --micro-batch 2 --global-batch 4 --quiet --lr 1e-2 \
    --lr-schedule $kind --warmup 4 --min-lr 1e-3 --metrics "$tmp/$kind.jsonl" >/dev/null 2>&1
  check "$kind lr per step equals the formula (p = 0.25 and 0.75 among them)" "$PY - $tmp/$kind.jsonl $kind <<'EOF'
import json, math, sys
lr, mn, W, S = 1e-2, 1e-3, 4, 20
def want(s):
    if s <= W: return lr * s / W
    p = (s - W) / (S - W)
    if sys.argv[2] == 'cosine': return mn + (lr - mn) * 0.5 * (1 + math.cos(math.pi * p))
    return lr + (mn - lr) * p
pin = {'cosine': {8: 8.6819805e-3, 16: 2.3180195e-3}, 'linear': {8: 7.75e-3, 16: 3.25e-3}}[sys.argv[2]]
got = dict((o['step'], o['lr']) for o in map(json.loads, open(sys.argv[1])))
ok = len(got) == 20 and all(abs(l - want(s)) <= 1e-7 * want(s) for s, l in got.items())
ok = ok and all(abs(got[s] - v) <= 1e-7 for s, v in pin.items())
sys.exit(0 if ok else 1)
EOF"
done

# token shards: uint16 and uint32 of the same tokens train alike (by glob, two files each);
# an id beyond the vocabulary is refused naming the file and position
"$bin" train --model tiny-dense --steps 2 --seq 16 --micro-batch 2 --global-batch 4 --quiet \
  --dump-data "$tmp/corpus.bin" >/dev/null 2>&1
mkdir -p "$tmp/u16" "$tmp/u32"
$PY - "$tmp/corpus.bin" "$tmp" <<'EOF'
import struct, sys, array
b = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<i", b, 8)[0]
toks = array.array("H"); toks.frombytes(b[1024:1024 + 2 * n])
def write(path, magic, ver, typ, t):
    h = array.array("i", [0] * 256); h[0], h[1], h[2] = magic, ver, len(t)
    with open(path, "wb") as f: h.tofile(f); array.array(typ, t).tofile(f)
half = 40000
for name, magic, ver, typ in (("u16", 20240520, 1, "H"), ("u32", 20240801, 7, "I")):
    write("%s/%s/part_0.bin" % (sys.argv[2], name), magic, ver, typ, toks[:half])
    write("%s/%s/part_1.bin" % (sys.argv[2], name), magic, ver, typ, toks[half:])
write(sys.argv[2] + "/big.bin", 20240801, 7, "I", [1, 2, 300, 4] * 100)
EOF
run_shards() { "$bin" train --model tiny-dense --steps 4 --seq 16 --micro-batch 2 --global-batch 4 --quiet --data "$1" --metrics "$2" >/dev/null 2>&1; }
run_shards "$tmp/u16/part_*.bin" "$tmp/u16.jsonl"
run_shards "$tmp/u32/part_*.bin" "$tmp/u32.jsonl"
check "uint16 and uint32 shards by glob train alike" "$PY -c \"
import json, sys
a = [json.loads(l)['loss'] for l in open('$tmp/u16.jsonl')]
b = [json.loads(l)['loss'] for l in open('$tmp/u32.jsonl')]
sys.exit(0 if a == b and len(a) == 4 else 1)\""
err=$("$bin" train --model tiny-dense --steps 1 --seq 16 --quiet --data "$tmp/big.bin" 2>&1); rc=$?
check "token id beyond the vocabulary refused naming file and position" \
  "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'big.bin: token id 300 at position 2 is outside the model.s vocabulary of 256'"
err=$("$bin" train --model tiny-dense --steps 1 --data "$tmp/none_*.bin" 2>&1); rc=$?
check "a glob matching nothing is refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'no token shard matches'"

# usage errors are one line, exit 2
for args in "--resume latest" "--checkpoint-every 5" "--eval-every 5" "--lr-schedule step" "--decay most" \
            "--warmup 30 --steps 20" "--min-lr 1 --lr 0.1"; do
  err=$("$bin" train --model tiny-dense $args 2>&1); rc=$?
  check "usage error: $args" "[ $rc -eq 2 ] && [ \$(echo \"\$err\" | wc -l) -eq 1 ]"
done

# export and the report's plots
out=$("$bin" export --checkpoint "$d/a" --out "$tmp/hf" 2>&1); rc=$?
check "export writes model.safetensors and config.json" "[ $rc -eq 0 ] && [ -s $tmp/hf/model.safetensors ] && grep -q LlamaForCausalLM $tmp/hf/config.json"
out=$("$bin" train --init-from "$tmp/hf" --steps 1 --seq 16 --micro-batch 2 --global-batch 4 2>&1); rc=$?
check "--init-from an exported folder: its config.json is the model" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q '^train LlamaForCausalLM on mesh' && echo \"\$out\" | grep -q 'initialized from $tmp/hf'"
err=$("$bin" train --model tiny-text --init-from "$tmp/hf" --steps 1 2>&1); rc=$?
check "--init-from a folder whose config.json disagrees with --model: refused naming the field" \
  "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'config.json: vocab_size is 256 but model tiny-text has 1024'"
err=$("$bin" train --model tiny-text --init-from "$tmp/hf/model.safetensors" --steps 1 2>&1); rc=$?
check "--init-from a file of another vocabulary: refused naming the tensor" \
  "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'tensor model.embed_tokens.weight has shape \[256, 64\]'"
check "export of synthetic data: config.json's bos and eos ids are null (not Llama's defaults 1 and 2)" \
  "$PY -c \"import json, sys; c = json.load(open('$tmp/hf/config.json')); sys.exit(0 if (c['bos_token_id'], c['eos_token_id'], c['torch_dtype']) == (None, None, 'float32') else 1)\""
# the tokenizer scripts/tokenize writes beside the shards goes with the export: its
# end-of-text token as bos and eos; --dtype bf16 halves the weights' bytes
cat >"$tmp/u16/tokenizer.json" <<'EOF'
{"version": "1.0", "added_tokens": [{"id": 3, "content": "<|endoftext|>", "special": true}],
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "<|endoftext|>": 3}, "merges": []}}
EOF
"$bin" train --model tiny-dense --steps 2 --seq 16 --micro-batch 2 --global-batch 4 --quiet --data "$tmp/u16/part_*.bin" \
  --checkpoint-dir "$tmp/tokck" >/dev/null 2>&1
out=$("$bin" export --checkpoint "$tmp/tokck" --out "$tmp/hftok" --dtype bf16 2>&1); rc=$?
check "export: the tokenizer beside the shards copied with its config, <|endoftext|> = 3 as bos and eos" \
  "[ $rc -eq 0 ] && cmp -s $tmp/u16/tokenizer.json $tmp/hftok/tokenizer.json && $PY -c \"import json, sys
c, t = json.load(open('$tmp/hftok/config.json')), json.load(open('$tmp/hftok/tokenizer_config.json'))
sys.exit(0 if (c['bos_token_id'], c['eos_token_id'], t['eos_token'], t['bos_token']) == (3, 3, '<|endoftext|>', '<|endoftext|>') else 1)\""
check "export --dtype bf16: BF16 tensors, half the fp32 file's data, config.json bfloat16" \
  "grep -q '\"dtype\":\"BF16\"' $tmp/hftok/model.safetensors && ! grep -q '\"F32\"' $tmp/hftok/model.safetensors && grep -q '\"torch_dtype\":.*\"bfloat16\"' $tmp/hftok/config.json && [ \$(stat -c %s $tmp/hftok/model.safetensors) -lt \$(( \$(stat -c %s $tmp/hf/model.safetensors) * 6 / 10 )) ]"
echo '{"added_tokens": [], "model": {"vocab": {"a": 0, "z": 300}}}' >"$tmp/bigtok.json"
err=$("$bin" export --checkpoint "$tmp/tokck" --out "$tmp/hftok2" --tokenizer "$tmp/bigtok.json" 2>&1); rc=$?
check "export: a tokenizer with ids beyond the vocabulary refused" \
  "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'bigtok.json: ids reach beyond it; the model.s vocabulary is 256' && [ ! -e $tmp/hftok2/model.safetensors ]"
err=$("$bin" export --checkpoint "$tmp/tokck" --out "$tmp/hftok2" --dtype fp16 2>&1); rc=$?
check "export --dtype fp16 is a usage error" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose fp32 or bf16'"
err=$("$bin" export --checkpoint "$tmp/nothing" --out "$tmp/hf2" 2>&1); rc=$?
check "export of a missing checkpoint refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'does not exist'"
# --eval-only: the eval loss of a checkpoint, or of an --init-from folder, without a step:
# the one the training run recorded at the checkpoint's step, bit for bit (the same weights
# on the same batches); printed, appended to --metrics and recorded as its own --db run
v="$tmp/evalonly"
rm -rf "$v"; mkdir -p "$v/empty"
erun=(train --model tiny-dense --seq 16 --micro-batch 2 --global-batch 4 --quiet --val-data "$tmp/u16/part_1.bin")
"$bin" "${erun[@]}" --steps 6 --eval-every 3 --checkpoint-dir "$v/ck" --metrics "$v/train.jsonl" >/dev/null 2>&1
out=$("$bin" "${erun[@]}" --checkpoint-dir "$v/ck" --resume latest --eval-only --metrics "$v/eval.jsonl" \
      --db "$v/r.db" 2>&1); rc=$?
echo "$out" | grep '^eval'
same_eval() { # TRAIN.jsonl EVAL.jsonl STEP: the evaluation's loss is the training run's at step 6
  $PY - "$1" "$2" "$3" <<'EOF'
import json, sys
t = {o["step"]: o["eval_loss"] for o in map(json.loads, open(sys.argv[1]))}
e = [json.loads(l) for l in open(sys.argv[2])][-1]
sys.exit(0 if e["eval_only"] and e["step"] == int(sys.argv[3]) and e["eval_loss"] == t[6] else 1)
EOF
}
check "--eval-only of a checkpoint: the training run's eval loss at its step, bit for bit, printed" \
  "[ $rc -eq 0 ] && same_eval $v/train.jsonl $v/eval.jsonl 6 && echo \"\$out\" | grep -q '^eval: loss [0-9.]* of $v/ck/step_00000006 (step 6) on 4 global batches of $tmp/u16/part_1.bin'"
check "--eval-only: no step ran (no step line, no new checkpoint)" \
  "! echo \"\$out\" | grep -q '^step ' && [ \"\$(ls $v/ck | tr '\n' ' ')\" = 'step_00000006 ' ]"
rep=$("$bin" report --db "$v/r.db" --run 1 2>&1)
check "--eval-only --db: report shows the evaluation" \
  "echo \"\$rep\" | grep -q '^evaluation (train --eval-only): validation loss [0-9.]* of the weights at step 6 (complete)'"
"$bin" export --checkpoint "$v/ck" --out "$v/hf" >/dev/null 2>&1
"$bin" train --init-from "$v/hf" --seq 16 --micro-batch 2 --global-batch 4 --val-data "$tmp/u16/part_1.bin" --eval-only \
  --metrics "$v/eval.jsonl" >/dev/null 2>&1
check "--eval-only --init-from the exported folder: the same eval loss" "same_eval $v/train.jsonl $v/eval.jsonl 0"
err=$("$bin" train --model tiny-dense --eval-only --checkpoint-dir "$v/empty" --resume latest 2>&1); rc=$?
check "--eval-only --resume latest of an empty folder refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'holds no checkpoint to evaluate'"

if command -v gnuplot >/dev/null; then
  out=$("$bin" report --db "$db" --run 1 --plot "$tmp/plots" 2>&1); rc=$?
  check "report --plot draws loss.png and throughput.png" "[ $rc -eq 0 ] && [ -s $tmp/plots/loss.png ] && [ -s $tmp/plots/throughput.png ]"
fi
exit $fail
