#!/bin/bash
# Hostile input, through the binary: a table of bad inputs across every command, each with
# the exit code it must give and the words its one-line message must hold. For every row:
# the exit code matches, stderr is exactly one line, that line starts with
# "meshplan <command>: " and carries that prefix once (never "meshplan plan: meshplan plan:"),
# and no run hangs (a FIFO given as an input used to block forever). The issue's cases are
# here by name; so are the refusals that exited 1 and the messages that doubled their prefix.
# Runs from the runfiles root. Usage: hostile_cli_test.sh MESHPLAN
set -u
bin="$1"
d="${TEST_TMPDIR:-$(mktemp -d)}/hostile"
rm -rf "$d"
mkdir -p "$d/adir"
fails=0
rows=0

# ---- fixtures -----------------------------------------------------------------------------
mkfifo "$d/fifo.json" "$d/fifo.db" "$d/fifo.csv" "$d/fifo.bin"
model() { printf '{"name": "x", "family": "llama", "vocab": 256, "n_layers": 2, "d_ff": 128, %s}' "$1" >"$d/$2"; }
model '"d_model": 3000000000, "n_heads": 8' big_d_model.json
model '"d_model": 64, "n_heads": 7' heads7.json
model '"d_model": 64, "n_heads": 8, "norm_eps": 1e999' inf_eps.json
printf '{"name": "x", "family": "llama", "vocab": -5, "n_layers": 2, "d_ff": 128, "d_model": 64, "n_heads": 8}' >"$d/neg_vocab.json"
printf '{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 7, "intermediate_size": 128}' >"$d/hf_heads7.json"
# silent readings: a moe object without experts, a Mixtral of none, a config naming no architecture
model '"d_model": 64, "n_heads": 8, "moe": {"n_experts": 0, "top_k": 1, "d_ff_expert": 32}' moe0.json
printf '{"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 128, "num_local_experts": 0, "num_experts_per_tok": 2}' >"$d/hf_mixtral0.json"
printf '{"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 128}' >"$d/hf_noarch.json"
# a key twice (cJSON reads the first, Python the last), in every reader's files
model '"d_model": 64, "n_heads": 8,
 "n_heads": 4' twice.json
printf '{"model_type": "qwen2", "vocab_size": 256, "hidden_size": 64,\n "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 128,\n "hidden_size": 128}' >"$d/hf_twice.json"
printf '{"name": "g", "peak_tflops": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9},\n "mem_gib": 80.0, "hbm_GBps": 3350.0, "nvlink_GBps_per_dir": 450.0, "mem_gib": 40.0, "source": "t"}' >"$d/gpu_twice.json"
printf '{"name": "s", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "source": "t", "gemm_eff_max": 0.5}' >"$d/stack_twice.json"
cluster() { printf '{"name": "c", "gpu": "h100-sxm", "gpus_per_node": 8, "n_nodes": 2, %s}' "$1" >"$d/$2"; }
cluster '"intra_node_GBps_per_gpu": 0, "inter_node_Gbitps_per_gpu": 400' zero_bw.json
cluster '"intra_node_GBps_per_gpu": 450, "inter_node_Gbitps_per_gpu": 400, "inter_node_latency_us": -3' neg_lat.json
cluster '"intra_node_GBps_per_gpu": 450, "inter_node_Gbitps_per_gpu": 1e999' inf_bw.json
cluster '"intra_node_GBps_per_gpu": 450, "inter_node_Gbitps_per_gpu": 400, "n_nodes": 4' cluster_twice.json
printf '{"name": "s", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": -4, "comm_overhead_us": 5, "frag_factor": 1.1, "source": "t"}' >"$d/neg_stack.json"
printf '{"name": "m", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "memory_model": "megatron", "async_tp": true, "source": "t"}' >"$d/mg_async.json"
printf '{"name": "d", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "distributed_optimizer": true, "source": "t"}' >"$d/tt_distopt.json"
printf '{"name": "o", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "tp_comm_overlap": true, "source": "t"}' >"$d/tt_tpoverlap.json"
printf '{"name": "r", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "memory_model": "megatron", "cp_overlap": false, "source": "t"}' >"$d/mg_cpsync.json"
hdr="case,model,gpu,gpus,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,cp,ep,seq,local_batch,global_batch,ac,fp8,stack,metric,value"
csv() { printf '%s\n%s\n' "$hdr" "$1" >"$d/$2"; }
csv 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,step_time_s,nan' nan.csv
csv 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,step_time_s,inf' inf.csv
csv 'a,tiny-dense,h100-sxm,8,8,inf,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,step_time_s,1' inf_bw.csv
csv 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,9223372036854775807,1,8,none,0,torchtitan-eager,step_time_s,1' seq.csv
csv 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,flops,1' metric.csv
csv 'a,tiny-dense,h100-sxm,8,8,,1,4,1,2,zb,1,1,64,2,8,none,0,torchtitan-eager,step_time_s,1' zb_row.csv
# Megatron-Core's cp comm type on a stack that does not run it, and a name it does not have
printf '%s,cp_comm_type\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,4,1,1,,2,1,64,1,4,none,0,torchtitan-eager,step_time_s,1,all_gather' >"$d/cpc_tt.csv"
printf '%s,cp_comm_type\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,4,1,1,1,,2,1,64,1,4,none,0,megatron-core,step_time_s,1,allgather' >"$d/cpc_bad.csv"
# Megatron-Core's float8 weights on a row without float8
printf '%s,fp8_param_gather\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,8,1,1,1,,1,1,64,1,8,none,0,megatron-core,step_time_s,1,1' >"$d/fpg_bf16.csv"
# torchtitan's float8 all-gather on a megatron row
printf '%s,fp8_all_gather\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,1,megatron-core,step_time_s,1,1' >"$d/fag_mg.csv"
# FSDP1's flat parameters on a megatron row
printf '%s,fsdp_flat_params\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,megatron-core,step_time_s,1,1' >"$d/flat_mg.csv"
# Megatron FSDP's columns on a torchtitan row, and a strategy Megatron does not have
printf '%s,mfsdp_strategy\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,step_time_s,1,optim_grads_params' >"$d/mfsdp_tt.csv"
printf '%s,mfsdp_strategy\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,megatron-core,step_time_s,1,zero3' >"$d/mfsdp_bad.csv"
# local_batch 2 on 2 x 4 data-parallel ranks is 16 sequences, not the row's global_batch 8
csv 'lb,tiny-dense,h100-sxm,8,8,,2,4,1,1,,1,1,64,2,8,none,0,torchtitan-eager,step_time_s,1' local_batch.csv
# the optional async_tp column: 0 or 1, and 1 only under a stack that runs AsyncTP
printf '%s,async_tp\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,4,2,1,,1,1,64,1,4,none,0,torchtitan-compile,step_time_s,1,2' >"$d/async2.csv"
printf '%s,async_tp\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,4,2,1,,1,1,64,1,4,none,0,torchtitan-eager,step_time_s,1,1' >"$d/async_eager.csv"
printf '%s,fp8_recipe\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,1,torchtitan-compile,step_time_s,1,hybrid' >"$d/recipe_bad.csv"
printf '%s,fp8_recipe\n%s\n' "$hdr" 'a,tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-compile,step_time_s,1,delayed' >"$d/recipe_nofp8.csv"
printf '{"name": "w", "gemm_eff_max": 0.8, "gemm_eff_half_mnk": 1e9, "fp8_gemm_eff_max": 0.8, "attention_eff": 0.5, "hbm_eff": 0.8, "link_eff": 0.8, "kernel_overhead_us": 4, "comm_overhead_us": 5, "frag_factor": 1.1, "memory_model": "megatron", "fp8_recipe": "rowwise", "source": "t"}' >"$d/mg_rowwise.json"
# another program's SQLite files: a schema_version holding text; an application_id of its own
sqlite3 "$d/foreign.db" "CREATE TABLE schema_version(version TEXT); INSERT INTO schema_version VALUES ('abc'); CREATE TABLE songs(x);"
sqlite3 "$d/other_app.db" "PRAGMA application_id=1234; CREATE TABLE t(x);"
printf 'not a database, not at all' >"$d/garbage.db"
foreign_sum=$(cksum <"$d/foreign.db")
printf '%s' "short" >"$d/short.bin"

# the training loop's inputs: a real checkpoint of tiny-dense, copies of its step folder
# with one thing wrong each (the manifest edited by Python's json), safetensors files whose
# header lies; a FIFO and a directory where files are due
"$bin" train --model tiny-dense --steps 1 --checkpoint-dir "$d/ck" --quiet >/dev/null 2>&1 ||
  echo "FAIL: the fixture checkpoint could not be written"
step="$d/ck/step_00000001"
ckpt_variant() { # NAME PYTHON: a copy of the step folder, PYTHON run on its manifest `m`
  rm -rf "$d/$1"
  cp -r "$step" "$d/$1"
  /usr/bin/python3 - "$d/$1/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in m["tensors"]}
exec(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"))
PY
}
ckpt_variant ck_dotdot 'm["files"][0]["name"] = "../ck/step_00000001/rank_00000.bin"'
ckpt_variant ck_dots 'm["files"][0]["name"] = ".."'
ckpt_variant ck_consumed 'm["data_consumed"] = 1e300'
ckpt_variant ck_twice 'pass'
sed -i 's/"step": \([0-9]*\),/"step": \1, "step": \1,/' "$d/ck_twice/manifest.json"
# q_proj [64, 64] as two shards of 32 rows holding k_proj's and v_proj's bytes (checksums
# intact), the second at row 16: rows 16..31 twice, rows 48..63 never; the element count
# matches the tensor's
ckpt_variant ck_overlap 'q = t["layers.0.attention.q_proj.weight"]; k = t["layers.0.attention.k_proj.weight"]["shards"][0]; v = dict(t["layers.0.attention.v_proj.weight"]["shards"][0]); v["offset"] = [16, 0]; q["shards"] = [k, v]'
# export's silent wrong answers: a tensor entry removed (transformers would fill the norm
# with 1.0), one listed twice (an unreadable safetensors file), a "model" whose vocab
# disagrees with the tensors (a wrong config.json)
ckpt_variant ck_missing 'm["tensors"] = [x for x in m["tensors"] if x["name"] != "norm.weight"]'
ckpt_variant ck_dup 'm["tensors"].append(t["layers.1.ffn_norm.weight"])'
ckpt_variant ck_vocab 'm["model"]["vocab"] = 512'
rm -rf "$d/ck_trunc"; cp -r "$step" "$d/ck_trunc"
truncate -s -4 "$d/ck_trunc/rank_00000.bin"
rm -rf "$d/ck_grown"; cp -r "$step" "$d/ck_grown"
truncate -s +4 "$d/ck_grown/rank_00000.bin"
rank_bytes=$(stat -c %s "$step/rank_00000.bin")
ckpt_variant ck_fifo_shard 'pass'
rm "$d/ck_fifo_shard/rank_00000.bin"; mkfifo "$d/ck_fifo_shard/rank_00000.bin"
ckpt_variant ck_fifo_manifest 'pass'
rm "$d/ck_fifo_manifest/manifest.json"; mkfifo "$d/ck_fifo_manifest/manifest.json"
st_file() { # NAME HEADER DATA_BYTES [LENGTH]: a safetensors file, its length field LENGTH (default: the header's)
  /usr/bin/python3 - "$d/$1" "$2" "$3" "${4:-}" <<'PY'
import struct, sys
h = sys.argv[2].encode()
n = int(sys.argv[4]) if sys.argv[4] else len(h)
open(sys.argv[1], "wb").write(struct.pack("<Q", n) + h + bytes(int(sys.argv[3])))
PY
}
st_file st_long.safetensors '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8 1000000
st_file st_huge_shape.safetensors '{"x":{"dtype":"F32","shape":[1e300],"data_offsets":[0,8]}}' 8
st_file st_twice.safetensors '{"x":{"dtype":"F32","shape":[2],"dtype":"BF16","data_offsets":[0,8]}}' 8
st_file st_overflow.safetensors '{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}' 8
mkdir -p "$d/hf_fifo"; mkfifo "$d/hf_fifo/model.safetensors"

printf '[model]\nname = "llama3"\nflavor = "8B"\n' >"$d/hand_default.toml"

# ---- the check ---------------------------------------------------------------------------
# row WANT_RC 'WANT_TEXT' ARGS...; with ULIMIT_F=K in the environment, under `ulimit -f K`
row() {
  local want_rc=$1 want=$2
  shift 2
  rows=$((rows + 1))
  local cmd=$1
  (if [ -n "${ULIMIT_F:-}" ]; then ulimit -f "$ULIMIT_F"; fi; exec timeout 30 "$bin" "$@") >"$d/out" 2>"$d/err"
  local rc=$? lines prefix
  lines=$(wc -l <"$d/err")
  prefix="meshplan $cmd: "
  local line; line=$(head -n 1 "$d/err")
  if [ "$rc" = 124 ]; then
    echo "FAIL: meshplan $*: hung (killed after 30 s)"; fails=$((fails + 1)); return
  fi
  if [ "$rc" != "$want_rc" ]; then
    echo "FAIL: meshplan $*: exit $rc, want $want_rc: $line"; fails=$((fails + 1)); return
  fi
  if [ "$lines" != 1 ]; then
    echo "FAIL: meshplan $*: $lines lines on stderr, want 1:"; sed 's/^/    /' "$d/err"; fails=$((fails + 1)); return
  fi
  if [ "${line#"$prefix"}" = "$line" ]; then
    echo "FAIL: meshplan $*: the line does not start with '$prefix': $line"; fails=$((fails + 1)); return
  fi
  local rest=${line#"$prefix"}
  case "$rest" in
    "meshplan "* | "$cmd: "*) echo "FAIL: meshplan $*: doubled prefix: $line"; fails=$((fails + 1)); return ;;
  esac
  if ! grep -qF -- "$want" <<<"$line"; then
    echo "FAIL: meshplan $*: the line lacks '$want': $line"; fails=$((fails + 1)); return
  fi
}

# ---- the issue's cases -------------------------------------------------------------------
# crash (heap overflow in mp_corpus_batch)
row 2 "--global-batch '4611686018427387904': expected an integer in 1..16777216" train --global-batch 4611686018427387904
# hangs: the micro-batch loop, a trace that could not grow, a FIFO as an input
row 2 "--global-batch '4611686018427387904': expected an integer in 1..16777216" plan --no-db --model tiny-dense --global-batch 4611686018427387904
row 2 "--global-batch '8589934592': expected an integer in 1..16777216" simulate --model tiny-dense --global-batch 8589934592 --trace "$d/t.json"
row 2 "the trace of 2097152 micro-batches would hold more than 1048576 events" simulate --model tiny-dense --global-batch 16777216 --trace "$d/t.json"
row 2 "$d/fifo.json: is a named pipe (FIFO), not a regular file" plan --no-db --model "$d/fifo.json"
row 2 "$d/fifo.json: is a named pipe (FIFO), not a regular file" plan --no-db --hf-config "$d/fifo.json"
row 2 "$d/fifo.json: is a named pipe (FIFO), not a regular file" simulate --model tiny-dense --cluster "$d/fifo.json"
row 2 "$d/fifo.json: is a named pipe (FIFO), not a regular file" simulate --model tiny-dense --stack "$d/fifo.json"
row 2 "$d/fifo.json: is a named pipe (FIFO), not a regular file" simulate --model tiny-dense --gpus 8 --gpu "$d/fifo.json"
row 2 "$d/fifo.csv: is a named pipe (FIFO), not a regular file" validate "$d/fifo.csv"
row 2 "$d/fifo.bin: is a named pipe (FIFO), not a regular file" train --model tiny-dense --data "$d/fifo.bin" --steps 1
row 2 "$d/fifo.db: is a named pipe (FIFO), not a regular file" plan --model tiny-dense --db "$d/fifo.db"
row 2 "$d/fifo.db: is a named pipe (FIFO), not a regular file" report --db "$d/fifo.db"
row 2 "$d/fifo.db: is a named pipe (FIFO), not a regular file" train --model tiny-dense --db "$d/fifo.db" --steps 1
# wrong answers with exit 0
row 1 "training diverged and stopped" train --model tiny-dense --lr 1000 --clip 0
row 2 "d_model = 3000000000 is out of range; accepted 1..1048576" plan --no-db --model "$d/big_d_model.json"
row 2 "--seq '9223372036854775807': expected an integer in 1..16777216" plan --no-db --model tiny-dense --seq 9223372036854775807
row 2 "intra_node_GBps_per_gpu = 0 is out of range; accepted (0, 100000]" plan --no-db --model tiny-dense --cluster "$d/zero_bw.json"
row 2 "inter_node_latency_us = -3 is out of range; accepted [0, 1e+06]" plan --no-db --model tiny-dense --cluster "$d/neg_lat.json"
row 2 "column 'value' = 'nan': expected a finite number in (0, 1e+15]" validate "$d/nan.csv"
row 2 "column 'value' = 'inf': expected a finite number in (0, 1e+15]" validate "$d/inf.csv"
row 2 "--pp-virtual '2147483647': expected an integer in 1..512" simulate --model tiny-dense --pp-virtual 2147483647
row 2 "n_heads = 7 does not divide d_model = 64 and 'head_dim' is not given" plan --no-db --model "$d/heads7.json"
row 2 "n_heads = 7 does not divide d_model = 64 and 'head_dim' is not given" plan --no-db --hf-config "$d/hf_heads7.json"
row 2 "$d/foreign.db is not a meshplan database or is corrupt; move it aside or pass --db" plan --model tiny-dense --db "$d/foreign.db"
row 2 "$d/foreign.db is not a meshplan database or is corrupt" report --db "$d/foreign.db"
row 2 "$d/other_app.db is not a meshplan database or is corrupt" train --model tiny-dense --db "$d/other_app.db" --steps 1
# doubled prefixes ("meshplan plan: meshplan plan: --seq '0' ...")
row 2 "--seq '0': expected an integer in 1..16777216" plan --no-db --seq 0
row 2 "--top '-1': expected an integer in 0..2147483647" report --top -1
row 2 "--steps '-1': expected an integer in 0..16777216" train --steps -1
row 2 "--rank '-1': expected an integer in 0..1048575" explain --rank -1
row 2 "--reps '0': expected an integer in 1..10000" calibrate --reps 0 --db "$d/cal.db"
row 2 "give --cluster or --gpus (with --gpu, --gpus-per-node, --inter-gbps), not both" simulate --cluster h100-8 --gpus 8
row 2 "--pp-schedule 'x': choose 1f1b, interleaved, gpipe, dualpipe, zbv or interleaved_zb" simulate --model tiny-dense --pp-schedule x
row 2 "--device tpu: choose cpu, cuda or cuda:N (N in 0..1023)" calibrate --device tpu
row 2 "--gpu is for --device cuda" calibrate --gpu h100-sxm --db "$d/cal.db"
row 2 "give one CSV file" validate
row 2 "unknown flag '--bogus'; see 'meshplan report --help'" report --bogus
row 2 "--model needs a value (M)" explain --model

# ---- refusals that exited 1: cannot open / write, databases, requests this machine cannot do
row 2 "$d/adir: is a directory, not a regular file" plan --no-db --model "$d/adir"
row 2 "$d/adir: is a directory, not a regular file" plan --model tiny-dense --db "$d/adir"
row 2 "$d/adir: is a directory, not a regular file" simulate --model tiny-dense --stack "$d/adir"
row 2 "$d/adir: is a directory, not a regular file" validate "$d/adir"
row 2 "$d/adir: cannot write: it is a directory, not a regular file" simulate --model tiny-dense --trace "$d/adir"
row 2 "$d/adir: cannot write: it is a directory, not a regular file" train --model tiny-dense --steps 1 --dump-losses "$d/adir"
row 2 "$d/no/such/dir/l.json: cannot create" train --model tiny-dense --steps 1 --dump-losses "$d/no/such/dir/l.json"
row 2 "$d/no/such/dir/w.bin: cannot create" train --model tiny-dense --steps 1 --dump-weights "$d/no/such/dir/w.bin"
row 2 "/dev/null: is a character device, not a regular file" plan --no-db --model /dev/null
row 2 "/dev/zero: is a character device, not a regular file" train --model tiny-dense --data /dev/zero --steps 1
row 2 "$d/none.json: cannot open: No such file or directory" plan --no-db --model "$d/none.json"
row 2 "$d/garbage.db is not a meshplan database or is corrupt" plan --model tiny-dense --db "$d/garbage.db"
row 2 "$d/garbage.db is not a meshplan database or is corrupt" simulate --model tiny-dense --calibration "$d/garbage.db"
row 2 "$d/garbage.db is not a meshplan database or is corrupt" calibrate --quick --db "$d/garbage.db"
row 2 "no database at $d/none.db" report --db "$d/none.db"
row 2 "$d/short.bin: too short for a token shard" train --model tiny-dense --data "$d/short.bin" --steps 1
row 2 "--plot $d/nan.csv exists and is not a directory" plan --no-db --model tiny-dense --plot "$d/nan.csv"
if ! nvidia-smi -L >/dev/null 2>&1; then
  row 2 "--device cuda:" train --model tiny-dense --device cuda
fi

# ---- more hostile numbers and files --------------------------------------------------------
row 2 "key 'norm_eps': expected a finite number, got inf" plan --no-db --model "$d/inf_eps.json"
row 2 "vocab = -5 is out of range; accepted 1..4194304" plan --no-db --model "$d/neg_vocab.json"
row 2 "key 'inter_node_Gbitps_per_gpu': expected a finite number, got inf" plan --no-db --model tiny-dense --cluster "$d/inf_bw.json"
row 2 "kernel_overhead_us = -4 is out of range; accepted [0, 1e+06]" simulate --model tiny-dense --stack "$d/neg_stack.json"
# the distributed optimizer is Megatron-LM's; torchtitan shards its state with FSDP
row 2 "distributed_optimizer is Megatron-LM's; the torchtitan memory model does not run it" simulate --model tiny-dense --stack "$d/tt_distopt.json"
row 2 "tp_comm_overlap is Megatron-Core's (Transformer Engine's userbuffers); the torchtitan memory model does not run it" plan --no-db --model tiny-dense --stack "$d/tt_tpoverlap.json"
# cp_overlap false names torchtitan's compiled ring; Megatron-LM's runs Transformer Engine's
row 2 "cp_overlap false names torchtitan's compiled ring, whose collectives wait where issued; the megatron memory model runs its own" simulate --model tiny-dense --stack "$d/mg_cpsync.json"
# AsyncTP: torchtitan-compile's alone, and only with SP to fuse
row 2 "async_tp is torchtitan's AsyncTP; the megatron memory model does not run it" simulate --model tiny-dense --stack "$d/mg_async.json"
row 2 "--async-tp: stack torchtitan-eager does not run AsyncTP" simulate --model tiny-dense --gpus 2 --mesh tp=2 --stack torchtitan-eager --async-tp
row 2 "--async-tp: stack meshplan-cpu does not run AsyncTP" explain --model tiny-dense --gpus 2 --gpu cpu --mesh tp=2 --async-tp
row 2 "it needs SP: drop --no-sp" simulate --model tiny-dense --gpus 2 --mesh tp=2 --async-tp --no-sp
row 2 "it needs SP: drop --no-sp" plan --no-db --model tiny-dense --gpus 2 --async-tp --no-sp
# the EP dispatcher and all-to-all overlap: Megatron-Core's, under its conditions
row 2 "--overlap-moe-comm is Megatron-Core's --overlap-moe-expert-parallel-comm; stack torchtitan-eager does not run it" simulate --model tiny-moe --gpus 4 --mesh dp_shard=4,ep=2 --stack torchtitan-eager --overlap-moe-comm
# Megatron-Core's fused cross-entropy and Megatron-LM's DDP switches: a Megatron stack's only
row 2 "--ddp-average-in-collective, --no-check-for-nan-in-loss-and-grad and --align-param-gather are Megatron-LM's DDP options; stack torchtitan-compile does not run it" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack torchtitan-compile --ddp-average-in-collective
row 2 "--ddp-bucket-size is Megatron-LM's DDP option; stack torchtitan-compile does not run it" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack torchtitan-compile --ddp-bucket-size 64
row 2 "--ddp-bucket-size '0': expected an integer in" explain --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-core --ddp-bucket-size 0
row 2 "--cross-entropy-loss-fusion fuses Megatron-LM's vocab-parallel cross-entropy; stack torchtitan-compile does not run it" explain --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack torchtitan-compile --cross-entropy-loss-fusion
# Megatron-Core's CUDA graphs: its scopes, on its stack, under its rules
row 2 "cuda graphs 'full': choose none, attn, layers, iteration, attn+moe_router or attn+moe_router+moe_preprocess" simulate --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-core --cuda-graphs full
row 2 "cuda graphs layers: stack torchtitan-compile states no in-graph kernel cost (graph_kernel_overhead_us); CUDA graphs are Megatron-Core's: use megatron-core or none" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack torchtitan-compile --cuda-graphs layers
row 2 "CUDA graphs (layers) over tiny-moe's MoE layers: the token dispatcher synchronises the host" simulate --model tiny-moe --gpus 4 --mesh dp_replicate=4,ep=2 --stack megatron-core --cuda-graphs layers
row 2 "CUDA graphs (iteration) with the DDP's gradient NaN check" explain --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-core --cuda-graphs iteration
row 2 "CUDA graphs (layers) with activation recomputation" simulate --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-core --cuda-graphs layers --ac full
row 2 "--moe-dispatcher 'foo': choose alltoall, deepep or hybridep" simulate --model tiny-moe --gpus 4 --mesh dp_replicate=4,ep=2 --stack megatron-core --moe-dispatcher foo
row 2 "MoE all-to-all overlap with pp=2 needs the interleaved schedule" simulate --model tiny-moe --gpus 4 --mesh dp_replicate=2,pp=2,ep=2 --stack megatron-core --overlap-moe-comm
row 2 "MoE dispatcher deepep is Megatron-Core's flex dispatcher with DeepEP (--moe-enable-deepep), which needs expert parallelism" explain --model tiny-moe --gpus 4 --mesh dp_replicate=4 --stack megatron-core --moe-dispatcher deepep
row 2 "column 'inter_node_gbps_per_gpu' = 'inf': expected a finite number in (0, 100000]" validate "$d/inf_bw.csv"
row 2 "column 'seq' = '9223372036854775807': expected an integer in 1..16777216" validate "$d/seq.csv"
row 2 "metric 'flops': expected tokens_per_s_per_gpu, peak_mem_gib or step_time_s" validate "$d/metric.csv"
row 2 "cp_comm_type 'all_gather' is Megatron-Core's --cp-comm-type; stack torchtitan-eager does not run it" validate "$d/cpc_tt.csv"
row 2 "cp_comm_type 'allgather': expected p2p, all_gather, a2a or a2a+p2p" validate "$d/cpc_bad.csv"
row 2 "mfsdp_strategy and fsdp_double_buffer are Megatron FSDP's, which a megatron stack runs with dp_shard > 1" validate "$d/mfsdp_tt.csv"
row 2 "fp8_param_gather 1 is Megatron-Core's --fp8-param-gather, which needs fp8 1 on a megatron stack" validate "$d/fpg_bf16.csv"
row 2 "fp8_all_gather 1 is torchtitan's enable_fsdp_float8_all_gather, which needs fp8 1 on a torchtitan stack" validate "$d/fag_mg.csv"
row 2 "fsdp_flat_params 1 is PyTorch FSDP1's, which runs on a torchtitan stack: empty the column" validate "$d/flat_mg.csv"
# --fp8-all-gather: torchtitan's, with float8 tensorwise
row 2 "--fp8-all-gather is torchtitan's enable_fsdp_float8_all_gather (FSDP2 with torchao's float8); stack megatron-core does not run it" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack megatron-core --fp8 --fp8-all-gather
row 2 "--fp8-all-gather gathers the float8 Linears' weights as float8 casts and needs them: add --fp8" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --fp8-all-gather
row 2 "float8 all-gather casts each weight shard with one per-tensor scale before FSDP gathers it (torchao); recipe rowwise scales otherwise" simulate --model tiny-dense --gpus 4 --mesh dp_shard=2,tp=2 --fp8 rowwise --fp8-all-gather
# --fp8-param-gather: Megatron-Core's, with float8 and the distributed optimizer (mxfp8 not under Megatron FSDP)
row 2 "--fp8-param-gather keeps Megatron-Core's weights as Transformer Engine float8 tensors; stack torchtitan-compile does not run it" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack torchtitan-compile --fp8 --fp8-param-gather
row 2 "--fp8-param-gather keeps the float8 Linears' weights in float8 and needs them: add --fp8" plan --no-db --model tiny-dense --gpus 2 --stack megatron-core --fp8 off --fp8-param-gather
row 2 "--fp8-param-gather is only supported with the distributed optimizer or Megatron FSDP" simulate --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-lm --fp8 --fp8-param-gather
row 2 "--fp8-param-gather with the mxfp8 recipe is priced under the distributed optimizer" explain --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack megatron-core --fp8 mxfp8 --fp8-param-gather
row 2 "mfsdp_strategy 'zero3': expected optim_grads_params, optim_grads, optim or no_shard" validate "$d/mfsdp_bad.csv"
row 2 "--data-parallel-sharding-strategy 'zero3': choose optim_grads_params, optim_grads, optim or no_shard" simulate --model tiny-dense --gpus 8 --mesh dp_shard=8 --stack megatron-core --data-parallel-sharding-strategy zero3
row 2 "Megatron FSDP's no_shard shards nothing, as Megatron's DDP does: use dp_replicate=8 instead of dp_shard=8" explain --model tiny-dense --gpus 8 --mesh dp_shard=8 --stack megatron-core --data-parallel-sharding-strategy no_shard
row 2 "column 'async_tp' = '2'" validate "$d/async2.csv"
row 2 "async_tp = 1: stack torchtitan-eager does not run AsyncTP" validate "$d/async_eager.csv"
# float8 recipes: a name validate does not know, a recipe without float8, one the stack's
# framework does not run, one the GPU cannot run, one the runtime does not train
row 2 "fp8_recipe 'hybrid': expected tensorwise, current, delayed, rowwise, mxfp8, blockwise or nvfp4" validate "$d/recipe_bad.csv"
row 2 "fp8_recipe 'delayed' names a float8 recipe but fp8 is 0" validate "$d/recipe_nofp8.csv"
row 2 "float8 recipe delayed is not one torchtitan's float8 (torchao) runs (it runs tensorwise, rowwise, mxfp8)" plan --no-db --model tiny-dense --fp8 delayed
row 2 "float8 recipe mxfp8 needs Blackwell's block-scaled tensor cores (compute capability 10.0 or later); h100-sxm is 9.0" simulate --model tiny-dense --fp8 mxfp8
row 2 "float8 recipe rowwise is not one meshplan's runtime runs (it runs tensorwise)" train --model tiny-dense --fp8 rowwise --steps 1
row 2 "key 'fp8_recipe': float8 recipe rowwise is not one Megatron-LM's float8 (Transformer Engine) runs" simulate --model tiny-dense --stack "$d/mg_rowwise.json"
row 2 "--gpus '2097152': expected an integer in 1..1048576" plan --no-db --model tiny-dense --gpus 2097152 --gpu h100-sxm
row 2 "--gpus-per-node '0': expected an integer in 1..4096" simulate --model tiny-dense --gpus 8 --gpus-per-node 0
row 2 "--inter-gbps 'nan': expected a number in (0, 100000]" simulate --model tiny-dense --gpus 16 --inter-gbps nan
row 2 "--headroom '1': expected a number in [0, 1)" plan --no-db --model tiny-dense --headroom 1
row 2 "--headroom 'inf': expected a number in [0, 1)" simulate --model tiny-dense --headroom inf
row 2 "--price '-1': expected a number in [0, 10000]" plan --no-db --model tiny-dense --price -1
row 2 "--threads '0': expected an integer in 1..4096" plan --no-db --model tiny-dense --threads 0
row 2 "--global-batch-tokens '0': expected an integer in 1..4294967296" plan --no-db --model tiny-dense --global-batch-tokens 0
row 2 "--micro-batch '0': expected an integer in 1..16777216" explain --model tiny-dense --micro-batch 0
row 2 "--ep '0': expected an integer in 1..1048576" explain --model tiny-moe --ep 0
row 2 "--weight-decay '-0.1': expected a number in [0, 1]" train --model tiny-dense --weight-decay -0.1
row 2 "--clip 'nan': expected a number in [0, 1e+09]" train --model tiny-dense --clip nan
row 2 "--lr '1e999': expected a number in [0, 10000]" train --model tiny-dense --lr 1e999
row 2 "--fanout '0': expected an integer in 1..65536" train --model tiny-dense --fanout 0
row 2 "--plan-id '0': expected an integer in 1..9223372036854775807" train --model tiny-dense --plan-id 0
row 2 "--run '99999999999999999999': expected an integer in 1..9223372036854775807" report --run 99999999999999999999
row 2 "a step of 1000 sequences of 16777216 tokens is more than 4294967296 tokens" plan --no-db --model tiny-dense --seq 16777216 --allow-long-seq --global-batch 1000
row 2 "--seq 65 is longer than tiny-dense's max_seq 64" plan --no-db --model tiny-dense --seq 65
row 2 "mesh dim tp='0': expected an integer in 1..1048576" explain --model tiny-dense --mesh tp=0
row 2 "--fix: tp=0 out of range (1..1048576)" plan --no-db --model tiny-dense --fix tp=0
row 2 "--fix: mb=99999999999 out of range (1..16777216)" plan --no-db --model tiny-dense --fix mb=99999999999

# ---- silent readings made refusals ----------------------------------------------------------
row 2 "moe.n_experts = 0: a MoE block needs at least one expert; drop the moe object for a dense model" plan --no-db --model "$d/moe0.json"
row 2 "num_local_experts = 0: a Mixtral block needs at least one expert" plan --no-db --hf-config "$d/hf_mixtral0.json"
row 2 "neither 'model_type' nor 'architectures' is given" plan --no-db --hf-config "$d/hf_noarch.json"
row 2 "neither 'model_type' nor 'architectures' is given" plan --no-db --model "$d/hf_noarch.json"
row 2 "local_batch 2 x 8 data-parallel ranks (dp_replicate 2 x dp_shard 4) is not global_batch 8" validate "$d/local_batch.csv"
row 2 "$d/twice.json: key \"n_heads\" appears twice (line 2); remove one" plan --no-db --model "$d/twice.json"
row 2 "$d/hf_twice.json: key \"hidden_size\" appears twice (line 3); remove one" plan --no-db --hf-config "$d/hf_twice.json"
row 2 "$d/gpu_twice.json: key \"mem_gib\" appears twice (line 2); remove one" simulate --model tiny-dense --gpus 8 --gpu "$d/gpu_twice.json"
row 2 "$d/cluster_twice.json: key \"n_nodes\" appears twice (line 1); remove one" simulate --model tiny-dense --cluster "$d/cluster_twice.json"
row 2 "$d/stack_twice.json: key \"gemm_eff_max\" appears twice (line 1); remove one" simulate --model tiny-dense --stack "$d/stack_twice.json"
row 2 "manifest.json: key \"step\" appears twice (line 1); remove one" train --model tiny-dense --steps 1 --resume "$d/ck_twice"
row 2 "st_twice.safetensors (its JSON header): key \"dtype\" appears twice (line 1); remove one" train --model tiny-dense --steps 1 --init-from "$d/st_twice.safetensors"

# ---- the training loop's inputs: data, --init-from, --resume, their numbers ----------------
row 2 "$d/fifo.bin: is a named pipe (FIFO), not a regular file" train --model tiny-dense --steps 1 --init-from "$d/fifo.bin"
row 2 "$d/fifo.bin: is a named pipe (FIFO), not a regular file" train --model tiny-dense --steps 1 --val-data "$d/fifo.bin"
row 2 "$d/fifo.bin: cannot list: Not a directory" train --model tiny-dense --steps 1 --resume "$d/fifo.bin"
row 2 "$d/fifo.bin: is a named pipe (FIFO), not a regular file" train --model tiny-dense --steps 1 --metrics "$d/fifo.bin"
row 2 "$d/hf_fifo/model.safetensors: is a named pipe (FIFO), not a regular file" train --model tiny-dense --steps 1 --init-from "$d/hf_fifo"
row 2 "$d/ck_fifo_manifest/manifest.json: is a named pipe (FIFO), not a regular file" train --model tiny-dense --steps 1 --resume "$d/ck_fifo_manifest"
row 2 "$d/ck_fifo_shard/rank_00000.bin: not a regular file; the checkpoint is damaged" train --model tiny-dense --steps 1 --resume "$d/ck_fifo_shard"
row 2 "$d/adir: is a directory, not a regular file" train --model tiny-dense --steps 1 --data "$d/adir"
row 2 "$d/adir: is a directory, not a regular file" train --model tiny-dense --steps 1 --val-data "$d/adir"
row 2 "rank_00000.bin, which holds $((rank_bytes - 4)) bytes: the file is truncated" train --model tiny-dense --steps 1 --resume "$d/ck_trunc"
row 2 "rank_00000.bin: $((rank_bytes + 4)) bytes, but the manifest says $rank_bytes" train --model tiny-dense --steps 1 --resume "$d/ck_grown"
row 2 "st_long.safetensors: header length 1000000 does not fit the file" train --model tiny-dense --steps 1 --init-from "$d/st_long.safetensors"
row 2 "tensor x: shape entry 0 is not a size" train --model tiny-dense --steps 1 --init-from "$d/st_huge_shape.safetensors"
row 2 "tensor x: shape entry 1 is not a size" train --model tiny-dense --steps 1 --init-from "$d/st_overflow.safetensors"
row 2 "manifest.json: a file entry is malformed" train --model tiny-dense --steps 1 --resume "$d/ck_dotdot"
row 2 "manifest.json: a file entry is malformed" train --model tiny-dense --steps 1 --resume "$d/ck_dots"
row 2 "manifest.json: a file entry is malformed" export --checkpoint "$d/ck_dots" --out "$d/exported"
row 2 "data_consumed (0..2^48)" train --model tiny-dense --steps 1 --resume "$d/ck_consumed"
row 2 "manifest.json: tensor norm.weight is missing" export --checkpoint "$d/ck_missing" --out "$d/exported"
row 2 "manifest.json: tensor norm.weight is missing" train --model tiny-dense --steps 1 --resume "$d/ck_missing"
row 2 "manifest.json: tensor layers.1.ffn_norm.weight is listed twice" export --checkpoint "$d/ck_dup" --out "$d/exported"
row 2 "manifest.json: tensor layers.1.ffn_norm.weight is listed twice" train --model tiny-dense --steps 1 --resume "$d/ck_dup"
row 2 "manifest.json: tensor tok_embeddings.weight has shape [256, 64, 1] (2 dims) in the checkpoint but [512, 64, 1] (2 dims) in model tiny-dense; the manifest's \"model\" disagrees with its tensors" export --checkpoint "$d/ck_vocab" --out "$d/exported"
rows=$((rows + 1))
if [ -e "$d/exported/model.safetensors" ] || [ -e "$d/exported/config.json" ]; then
  echo "FAIL: a refused export wrote $(ls "$d/exported")"; fails=$((fails + 1))
fi
row 2 "tensor layers.0.attention.q_proj.weight: shards 0 and 1 overlap" train --model tiny-dense --steps 1 --resume "$d/ck_overlap"
row 2 "--checkpoint-every '0': expected an integer in 1..16777216" train --model tiny-dense --checkpoint-dir "$d/ck2" --checkpoint-every 0
row 2 "--checkpoint-keep '-1': expected an integer in 0..16777216" train --model tiny-dense --checkpoint-dir "$d/ck2" --checkpoint-keep -1
row 2 "--eval-every '99999999999': expected an integer in 1..16777216" train --model tiny-dense --val-data "$d/short.bin" --eval-every 99999999999
row 2 "--eval-batches '0': expected an integer in 1..16777216" train --model tiny-dense --val-data "$d/short.bin" --eval-batches 0
row 2 "--warmup '1e3': expected an integer in 0..16777216" train --model tiny-dense --warmup 1e3
row 2 "--min-lr 'nan': expected a number in [0, 10000]" train --model tiny-dense --min-lr nan
row 2 "--decay-frac '2': expected a number in [0, 1]" train --model tiny-dense --decay-frac 2
row 2 "--seed '-1': expected an integer in 0..9223372036854775807" train --model tiny-dense --seed -1

# ---- the planner a user tries: usage mistakes exit 2 naming the rule; nothing fitting exits 1
row 2 "ep=3 does not divide the 8 experts of mixtral-8x7b (each EP rank holds the same number of whole experts); choose ep in {1, 2, 4, 8}" plan --no-db --model mixtral-8x7b --ep 3
row 2 "ep=2: llama3.1-8b is dense (no routed experts), so expert parallelism would partition nothing; drop --ep (ep=1)" plan --no-db --ep 2
row 2 "ep=2: tiny-dense is dense (no routed experts)" plan --no-db --model tiny-dense --mesh dp_shard=4,ep=2 --gpus 4
row 2 "--micro-batch 1024 is larger than --global-batch 8" plan --no-db --micro-batch 1024 --global-batch 8
row 2 "the fixed mesh dims multiply to 3, which does not divide the 8 GPUs" plan --no-db --fix tp=3
row 2 "--log-all logs every candidate to the database; drop --no-db" plan --no-db --log-all
row 1 "no plan fits llama3.1-70b on 1 x h100-sxm; the smallest change that fits, searched: --gpus 16" plan --no-db --model llama3.1-70b --gpus 1
row 1 "no plan fits llama3.1-70b on 16 x h100-sxm; the smallest change that fits, searched: --ac full" plan --no-db --model llama3.1-70b --gpus 16 --ac none
row 2 "unknown GPU 'h100x'; known: a100-40gb-sxm, a100-80gb-sxm, b200, cpu, gb200, gb300, h100-96gb-500w, h100-nvl, h100-pcie, h100-sxm, h200, h800, l40s, mi300x" plan --no-db --gpus 8 --gpu h100x
row 2 "GPU mi300x has no CUDA (rocm): meshplan's CUDA runtime (stack meshplan-cuda) cannot drive it" simulate --gpus 8 --gpu mi300x --stack meshplan-cuda
row 2 "GPU mi300x has no CUDA (rocm)" plan --no-db --gpus 8 --gpu mi300x --stack meshplan-cuda

# time and cost to train, and the sweep of cluster sizes
row 2 "--tokens '15X': expected a count in (0, 1e+18], a number with an optional suffix K, M, B or T" plan --no-db --tokens 15X
row 2 "--tokens '1e19': expected a count in (0, 1e+18]" plan --no-db --tokens 1e19
row 2 "--objective days needs --tokens T" plan --no-db --objective days
row 2 "--objective cost needs a price: cluster 8xh100-sxm has no price_per_gpu_hour" plan --no-db --gpus 8 --objective cost --tokens 1T
row 2 "--price and --price-per-gpu-hour are the same; give one" plan --no-db --price 2 --price-per-gpu-hour 3
row 2 "--objective fastest: use time, memory, tokens-per-dollar, days or cost" plan --no-db --objective fastest
row 2 "--gpus '8..4': expected N, A..B (the powers of two from A to B) or A..B:S (steps of S)" plan --gpus 8..4
row 2 "--gpus '1..1000:1': 1000 sizes, more than 64; a larger step" plan --gpus 1..1000:1
row 2 "--why is for one search: give --gpus N, not the sweep 8..16" plan --gpus 8..16 --why tp=1
row 2 "--gpus 8..16 sweeps GPUs of --gpu TYPE; give it or --cluster, not both" plan --gpus 8..16 --cluster h100-8
row 1 "no plan fits llama3.1-70b on any size of the sweep 1..4" plan --model llama3.1-70b --gpus 1..4
# ---- --emit and --from (app/emit.h, app/from_config.h): a plan or a key a framework or meshplan
# cannot express is refused by name, never written or read approximately --------------------
tt() { printf '[model]\nname = "llama3"\nflavor = "8B"\n%s\n' "$1" >"$d/$2"; }
tt '[parallelism]
data_parallel_shard_degree = 8' tt_ok.toml
tt '[training]
mixed_precision_param = "float32"' tt_fp32.toml
tt '[activation_checkpoint]
mode = "memory_budget"' tt_budget.toml
tt '[parallelism]
made_up_degree = 2' tt_unknown.toml
tt '[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "DualPipeV"' tt_dualpipev.toml
tt '[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "ZBVZeroBubble"
pipeline_parallel_layers_per_stage = 6' tt_zbv3.toml
tt '[[parallelism]]' tt_aot.toml
tt 'x = {a = 1}' tt_inline.toml
tt 'name = "qwen3"' tt_twice.toml
tt '[training]
global_batch_size = 64
[parallelism]
pipeline_parallel_degree = 2
data_parallel_shard_degree = 4' tt_ga.toml
printf '[model]\nname = "llama3"\nflavor = "1B"\n' >"$d/tt_flavor.toml"
printf '[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[parallelism]\ndata_parallel_shard_degree = 8\ntensor_parallel_degree = 2\nexpert_parallel_degree = 3\n' >"$d/tt_ep3.toml"
mg='--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --max-position-embeddings 131072 --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights --seq-length 8192 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather'
row 2 "--emit megatron: dp_shard=8 is FSDP, which stack torchtitan-compile does not run" simulate --model llama3.1-8b --gpus 8 --emit megatron --out "$d"
row 2 "--emit torchtitan: the plan was predicted under stack megatron-core, not torchtitan's" simulate --model llama3.1-8b --gpus 8 --mesh dp_replicate=8 --stack megatron-core --emit torchtitan --out "$d"
row 2 "--emit torchtitan: torchtitan v0.2.0 ships no flavor of llama2-7b" simulate --model llama2-7b --gpus 8 --emit torchtitan --out "$d"
row 2 "--emit torchtitan: ac selective (the attention module) has no torchtitan v0.2.0 policy" simulate --model llama3.1-8b --gpus 8 --ac selective --emit torchtitan --out "$d"
row 2 "--emit torchtitan: torchtitan runs FSDP2 (fully_shard); the plan runs FSDP1's flat parameters (--fsdp-flat-params): drop it" simulate --model llama3.1-8b --gpus 8 --mesh dp_shard=8 --fsdp-flat-params --emit torchtitan --out "$d"
row 2 "--fsdp-flat-params is PyTorch FSDP1's; the stack's memory model is not PyTorch FSDP's" simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --stack megatron-core --fsdp-flat-params
# torchtitan's ChunkedLossWrapper (--loss-chunks): a count of 1 or more, dividing the rank's sequence
# (torch._check(seq_len % num_chunks == 0)), under a torchtitan stack, with no v0.2.0 TOML key to emit
row 2 "--loss-chunks '0': expected an integer in 1.." simulate --model tiny-dense --gpus 2 --mesh dp_shard=2 --loss-chunks 0
row 2 "--loss-chunks '-8': expected an integer in 1.." explain --model tiny-dense --gpus 2 --mesh dp_shard=2 --loss-chunks -8
row 2 "loss_chunks 3 does not divide the rank's sequence of 4096 tokens" simulate --model llama3.1-8b --gpus 8 --mesh dp_shard=4,cp=2 --seq 8192 --loss-chunks 3
row 2 "loss_chunks 8 is torchtitan's ChunkedLossWrapper; the megatron memory model" simulate --model tiny-dense --gpus 2 --mesh dp_replicate=2 --stack megatron-core --loss-chunks 8
row 2 "--loss-chunks is torchtitan's ChunkedLossWrapper; stack megatron-core does not run it" plan --model tiny-dense --gpus 2 --stack megatron-core --loss-chunks 8 --no-db
row 2 "--loss-chunks '0': expected an integer in 1.." plan --model tiny-dense --gpus 2 --loss-chunks 0 --no-db
row 2 "--emit torchtitan: torchtitan v0.2.0's job config has no chunked loss" simulate --model llama3.1-8b --gpus 8 --mesh dp_shard=8 --loss-chunks 8 --emit torchtitan --out "$d"
row 2 "--emit torchtitan: tp=2 without sequence parallelism" simulate --model llama3.1-8b --gpus 8 --mesh dp_shard=4,tp=2 --no-sp --emit torchtitan --out "$d"
row 2 "--emit torchtitan: ep=2 with tp x cp = 2" simulate --model qwen3-30b-a3b --gpus 8 --mesh dp_shard=4,tp=2,ep=2 --ac full --emit torchtitan --out "$d"
row 2 "--emit megatron: ac full:2 has no Megatron-LM form" simulate --model llama3.1-8b --gpus 8 --mesh dp_replicate=8 --stack megatron-core --ac full:2 --emit megatron --out "$d"
row 2 "--emit megatron: the TP-only amax reduction is Transformer Engine's NVTE_DP_AMAX_REDUCE_INTERVAL=0, not a pretrain_gpt.py argument" simulate --model llama3.1-8b --gpus 8 --mesh dp_replicate=2,tp=4 --stack megatron-core --fp8 delayed --fp8-amax-tp-only --emit megatron --out "$d"
row 2 "--emit megatron: NVFP4 without the random Hadamard transform is Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1, not a pretrain_gpt.py argument" simulate --model llama3.1-8b --gpu b200 --gpus 8 --mesh dp_replicate=8 --stack megatron-core --fp8 nvfp4 --nvfp4-no-rht --emit megatron --out "$d"
row 2 "--emit 'nemo': choose torchtitan or megatron" simulate --model tiny-dense --emit nemo
row 2 "--emit is for one search: give --gpus N, not the sweep 8..16" plan --model tiny-dense --gpus 8..16 --emit torchtitan
row 2 "--out is where --emit writes" plan --no-db --model tiny-dense --out "$d"
row 2 "none of the 1 plans shown can be written for Megatron-LM core_v0.14.0" plan --no-db --model llama3.1-8b --gpus 8 --emit megatron --out "$d"
row 2 "training.mixed_precision_param = float32 changes cost in a way meshplan does not model" simulate --gpus 8 --from "$d/tt_fp32.toml"
row 2 "activation_checkpoint.mode = \"memory_budget\": meshplan prices none, selective and full" simulate --gpus 8 --from "$d/tt_budget.toml"
row 2 "parallelism.made_up_degree is not a torchtitan v0.2.0 key meshplan reads" explain --gpus 8 --from "$d/tt_unknown.toml"
row 2 "pipeline_parallel_schedule = \"DualPipeV\": meshplan prices 1F1B, Interleaved1F1B, GPipe, InterleavedZeroBubble and ZBVZeroBubble" simulate --gpus 8 --from "$d/tt_dualpipev.toml"
# Llama 3.1 8B's 32 layers + 2 in stages of 6: ceil(34 / 6) = 6 stages, 3 a rank; torchtitan's V
# schedules assert 2 a rank
row 2 "pipeline_parallel_layers_per_stage = 6 makes 6 stages over pp=2, which torchtitan refuses for ZBVZeroBubble" simulate --gpus 8 --from "$d/tt_zbv3.toml"
row 2 "--pp-virtual 3: ZBV runs exactly 2 chunks a stage in a V" simulate --model llama3.1-8b --gpus 8 --mesh pp=2,dp_shard=4 --pp-schedule zbv --pp-virtual 3
row 2 "--pp-schedule zbv: the runtime does not execute it" train --model tiny-dense --mesh pp=2 --pp-schedule zbv
row 2 "pp_schedule 'zb': expected 1f1b, interleaved, gpipe, dualpipe, zbv or interleaved_zb" validate "$d/zb_row.csv"
row 2 "arrays of tables ([[...]]) are not read" simulate --gpus 8 --from "$d/tt_aot.toml"
row 2 "inline tables are not read" simulate --gpus 8 --from "$d/tt_inline.toml"
row 2 "model.name is given twice" simulate --gpus 8 --from "$d/tt_twice.toml"
row 2 "gradient accumulation over a pipeline" simulate --gpus 8 --from "$d/tt_ga.toml"
row 2 "model llama3 flavor 1B has no meshplan model" simulate --gpus 8 --from "$d/tt_flavor.toml"
row 2 "parallelism.data_parallel_shard_degree = -1 takes the rest of the GPUs: give --gpus N" plan --no-db --gpus 8..16 --from "$d/hand_default.toml"
row 2 "parallelism.expert_parallel_degree = 3: with tensor and context parallel degrees 2 x 1 torchtitan takes whole tp x cp groups" simulate --gpus 16 --from "$d/tt_ep3.toml"
row 2 "--mesh 'dp_shard=4,tp=2' contradicts --from" simulate --gpus 8 --mesh dp_shard=4,tp=2 --from "$d/tt_ok.toml"
row 2 "--use-torch-fsdp2 runs PyTorch's FSDP2 inside Megatron-LM, which meshplan does not price" simulate --gpus 8 "--from-args=$mg --use-torch-fsdp2"
row 2 "--made-up-flag is not a Megatron-LM core_v0.14.0 flag meshplan reads" simulate --gpus 8 "--from-args=$mg --made-up-flag 3"
row 2 "--use-distributed-optimizer is absent, but meshplan's megatron-core stack" simulate --gpus 8 "--from-args=${mg/ --use-distributed-optimizer/}"
row 2 "--expert-model-parallel-size, --moe-enable-deepep or --overlap-moe-expert-parallel-comm without --num-experts" simulate --gpus 8 "--from-args=$mg --expert-model-parallel-size 2"
# Mixtral 8x7B's shape as Megatron-LM arguments (the experts' flags on the dense ones)
mx="${mg/--max-position-embeddings 131072/--max-position-embeddings 32768} --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --expert-model-parallel-size 2 --expert-tensor-parallel-size 1 --moe-token-dispatcher-type alltoall"
mx="${mx/--rotary-base 500000/--rotary-base 1000000}"
row 2 "no --moe-grouped-gemm: Megatron-LM would loop over its local experts" simulate --gpus 8 "--from-args=${mx/--moe-grouped-gemm/}"
row 2 "--moe-token-dispatcher-type allgather: meshplan prices the alltoall dispatcher" simulate --gpus 8 "--from-args=${mx/--moe-token-dispatcher-type alltoall/}"
row 2 "--moe-token-dispatcher-type alltoall --moe-enable-deepep: meshplan prices the alltoall dispatcher, or flex" simulate --gpus 8 "--from-args=$mx --moe-enable-deepep"
row 2 "--moe-router-score-function sigmoid: meshplan's router takes a softmax" simulate --gpus 8 "--from-args=$mx --moe-router-score-function sigmoid"
row 2 "--moe-layer-freq ([0]*3+[1]*28): an integer or a pattern of 0s and 1s, one a layer (32)" simulate --gpus 8 "--from-args=$mx --moe-layer-freq ([0]*3+[1]*28)"
row 2 "--moe-layer-freq [0,2]: an integer or a pattern" simulate --gpus 8 "--from-args=$mx --moe-layer-freq [0,2]"
row 2 "--moe-ffn-hidden-size disagrees with --model mixtral-8x7b" simulate --gpus 8 --model mixtral-8x7b "--from-args=$mx --moe-ffn-hidden-size 4096"
# the flex dispatcher takes etp > 1, but HybridEP's rank budget (the rank's own tokens x top_k x
# C_r, core_v0.19.0 _HybridEPManager) against etp x those rows received is refused by name
row 2 "etp=2 with HybridEP's rank capacity 1.5 is not modelled" simulate --model qwen3-30b-a3b --gpus 16 --mesh dp_replicate=8,tp=2,ep=4,etp=2 --seq 4096 --global-batch 64 --stack megatron-core --moe-dispatcher hybridep --moe-expert-rank-capacity-factor 1.5
# and so is the flex dispatcher's input padded to capacity under etp (DeepEP refuses the
# padding; HybridEP's drop_and_pad capacity counts etp x the experts, core_v0.19.0)
row 2 "etp=2 with the flex dispatcher's input padded to capacity is not modelled" simulate --model qwen3-30b-a3b --gpus 16 --mesh dp_replicate=8,tp=2,ep=4,etp=2 --seq 4096 --global-batch 64 --stack megatron-core --moe-dispatcher hybridep --moe-capacity-factor 1 --moe-pad-expert-input-to-capacity
# the flex dispatcher's copies to an expert's etp ranks are priced inside one NVLink domain:
# etp 16 on nodes of 8 is refused by name
row 2 "etp=16 with the DeepEP/HybridEP dispatcher spans NVLink domains of 8 GPUs" simulate --model qwen3-30b-a3b --gpus 32 --gpu h100-sxm --gpus-per-node 8 --mesh dp_replicate=16,tp=2,ep=2,etp=16 --seq 4096 --global-batch 64 --stack megatron-core --moe-dispatcher deepep
# and plan ranks no such plan: each candidate with etp 16 is refused by the simulator
row 1 "no plan fits mixtral-8x7b on 32 x h100-sxm; none of the changes tried fits" plan --no-db --model mixtral-8x7b --gpus 32 --gpu h100-sxm --stack megatron-core --moe-dispatcher deepep --fix etp=16
row 2 "--from: meshplan plan searches the dispatchers without their overlap" plan --no-db --gpus 8 "--from-args=${mx/--moe-token-dispatcher-type alltoall/--moe-token-dispatcher-type flex --moe-enable-deepep} --overlap-moe-expert-parallel-comm"
# Megatron-Core's full granularity needs a method and a count (transformer_config.py
# __post_init__, core_v0.14.0), and uniform groups must tile a chunk (32 layers here)
row 2 "--recompute-granularity full --recompute-method block" simulate --gpus 8 "--from-args=$mg --recompute-granularity full --recompute-method block"
row 2 "--recompute-num-layers 0: expected a layer count from 1 to 512" simulate --gpus 8 "--from-args=$mg --recompute-granularity full --recompute-method block --recompute-num-layers 0"
row 2 "recompute method uniform with 5 layers: model chunk 0 (stage 0) holds 32 layers" simulate --gpus 8 "--from-args=$mg --recompute-granularity full --recompute-method uniform --recompute-num-layers 5"
row 2 "recompute module moe: model" simulate --gpus 8 "--from-args=$mg --recompute-granularity selective --recompute-modules core_attn moe"
row 2 "--recompute-modules: unknown recompute module 'moe_layer'" simulate --gpus 8 "--from-args=$mg --recompute-granularity selective --recompute-modules moe_layer"
row 2 "--tensor-model-parallel-size 1 and 1 more: meshplan reads one value there" simulate --gpus 8 "--from-args=$mg --tensor-model-parallel-size 1 2"
row 2 "--cp-comm-type p2p a2a: a type a layer is not modelled; give one type for every layer" simulate --gpus 8 "--from-args=$mg --context-parallel-size 2 --cp-comm-type p2p a2a"
row 2 "--cp-comm-type allgather: choose p2p, all_gather, a2a or a2a+p2p" simulate --gpus 8 "--from-args=$mg --context-parallel-size 2 --cp-comm-type allgather"
row 2 "cp comm type a2a+p2p is hierarchical" simulate --gpus 8 "--from-args=$mg --context-parallel-size 2 --cp-comm-type a2a+p2p"
row 2 "--cp-comm-type 'ring': choose p2p, all_gather, a2a or a2a+p2p" simulate --model llama3.1-8b --gpus 8 --mesh dp_replicate=4,cp=2 --seq 16384 --stack megatron-core --cp-comm-type ring
row 2 "--cp-comm-type names Megatron-Core's context parallelism (Transformer Engine's); stack torchtitan-compile runs PyTorch's ring" simulate --model llama3.1-8b --gpus 8 --mesh dp_shard=4,cp=2 --seq 16384 --stack torchtitan-compile --cp-comm-type all_gather
row 2 "--cp-rotate names PyTorch's context-parallel ring; stack megatron-core runs Transformer Engine's context parallelism" explain --model llama3.1-8b --gpus 8 --mesh dp_replicate=4,cp=2 --seq 16384 --stack megatron-core --cp-rotate allgather
row 2 "cp comm type a2a splits each rank's heads over cp: cp=16 does not divide its 32 query heads and 8 key heads" simulate --model llama3.1-8b --gpus 16 --mesh cp=16 --seq 131072 --stack megatron-core --cp-comm-type a2a
row 2 "--moe-expert-capacity-factor -1: a positive number" simulate --gpus 8 "--from-args=$mx --moe-expert-capacity-factor -1"
row 2 "--from: meshplan plan searches AC policies, not recompute modules (--recompute-modules layernorm)" plan --no-db --gpus 8 "--from-args=$mg --recompute-granularity selective --recompute-modules layernorm"
row 2 "--from-args: --num-layers disagrees with --model llama3.1-70b" simulate --gpus 8 --model llama3.1-70b "--from-args=$mg"
row 2 "no model in data/models has the shape of these arguments" simulate --gpus 8 "--from-args=${mg/--num-layers 32/--num-layers 30}"
row 2 "give --from FILE or --from-args 'ARGS', not both" simulate --gpus 8 --from "$d/tt_ok.toml" "--from-args=$mg"

# report --import-log: the log's plan named, and a log with step lines
"$bin" plan --model tiny-dense --gpus 8 --top 1 --db "$d/imp.db" >/dev/null 2>&1
row 2 "--import-log stores the log as measurements of a run's plan; add --run ID" report --db "$d/imp.db" --import-log "$d/tt_ok.toml"
row 2 "--plan-rank names the plan --import-log measures; add --import-log FILE" report --db "$d/imp.db" --run 1 --plan-rank 2
row 2 "has no torchtitan (\"step: N  loss: X ... tps: Z\") or Megatron-LM" report --db "$d/imp.db" --run 1 --import-log "$d/tt_ok.toml"
row 2 "ranked plans, no rank 100000" report --db "$d/imp.db" --run 1 --import-log "$d/tt_ok.toml" --plan-rank 100000

# ---- out of room: a write past the file size limit (ulimit -f, in KiB) is an error naming
# the file, exit 1 (the input was fine), not a kill by SIGXFSZ (exit 153) ----------------------
mkdir -p "$d/lim"
ULIMIT_F=64 row 1 "file size limit exceeded writing $d/lim/ck/.tmp_step_00000002/rank_00000.bin" train --model tiny-dense --steps 2 --quiet --checkpoint-dir "$d/lim/ck"
rows=$((rows + 1))
if [ -n "$(ls -A "$d/lim/ck")" ]; then echo "FAIL: the failed save left $(ls -A "$d/lim/ck") in $d/lim/ck"; fails=$((fails + 1)); fi
ULIMIT_F=1 row 1 "file size limit exceeded writing $d/lim/m.jsonl" train --model tiny-dense --steps 10 --quiet --metrics "$d/lim/m.jsonl"
ULIMIT_F=700 row 1 "file size limit exceeded writing $d/lim/t.db" train --model tiny-dense --steps 400 --seq 16 --quiet --db "$d/lim/t.db"
ULIMIT_F=16 row 1 "file size limit exceeded writing $d/lim/p.db" plan --model tiny-dense --db "$d/lim/p.db"
rows=$((rows + 1))
if [ -e "$d/lim/p.db" ]; then echo "FAIL: plan --db under ulimit -f left $d/lim/p.db behind"; fails=$((fails + 1)); fi
# the plot's data file: planner/plot.c reports its write failures as "error writing" (exit 2)
ULIMIT_F=4 row 2 "error writing $d/lim/pl/candidates.dat" plan --no-db --model tiny-dense --plot "$d/lim/pl"

# ---- control characters in names (ESC, BEL, newline, a C1 control) are escaped in every
# table cell report and validate print: the tables keep one line a row and no raw control
# byte reaches the terminal ------------------------------------------------------------------
printf '{"name": "ev\\u001b[31mil\\u0007\\nrow\\u0085x", "family": "llama", "vocab": 256, "d_model": 64, "n_layers": 2, "n_heads": 8, "d_ff": 128}' >"$d/evil.json"
printf '%s\n%s\n' "$hdr" "$(printf 'ev\033[31mil\007x'),tiny-dense,h100-sxm,8,8,,1,8,1,1,,1,1,64,1,8,none,0,torchtitan-eager,step_time_s,0.01" >"$d/evil.csv"
"$bin" plan --model "$d/evil.json" --gpus 8 --top 1 --db "$d/evil.db" >/dev/null 2>&1
raw_controls() { LC_ALL=C grep -c $'[\x01-\x08\x0b-\x1f\x7f]\|\xc2[\x80-\x9f]' "$1"; }
for what in "report --db $d/evil.db" "report --db $d/evil.db --run 1" "validate $d/evil.csv"; do
  rows=$((rows + 1))
  # shellcheck disable=SC2086
  "$bin" $what >"$d/table" 2>&1
  if [ "$(raw_controls "$d/table")" != 0 ] || ! grep -qF 'ev\x1b[31mil\x07' "$d/table"; then
    echo "FAIL: meshplan $what: a name's control characters printed raw:"; cat -A "$d/table" | head -5; fails=$((fails + 1))
  fi
done
rows=$((rows + 1))
if [ "$("$bin" report --db "$d/evil.db" | grep -c '^ *[0-9]')" != 1 ] || ! "$bin" report --db "$d/evil.db" | grep -qF 'ev\x1b[31mil\x07\nrow\u0085x'; then
  echo "FAIL: report: the run's row is not one escaped line"; fails=$((fails + 1))
fi

# The foreign database was never written, nor switched to WAL.
rows=$((rows + 1))
if [ "$(cksum <"$d/foreign.db")" != "$foreign_sum" ] || [ -e "$d/foreign.db-wal" ]; then
  echo "FAIL: $d/foreign.db was written into"; fails=$((fails + 1))
fi
# A valid command still exits 0 (the table cannot pass by refusing everything).
rows=$((rows + 1))
if ! "$bin" plan --no-db --model tiny-dense --top 1 >/dev/null 2>"$d/err"; then
  echo "FAIL: a valid plan failed: $(cat "$d/err")"; fails=$((fails + 1))
fi
echo "$rows rows, $fails failed"
exit $((fails > 0))
