/* meshplan plan: the main job. (Skeleton: loads and prints the model and cluster; the
 * planner issue turns this into the ranked search.) */
#include <stdio.h>

#include "exec/cluster.h"
#include "exec/model.h"
#include "planner/commands.h"

static mp_opt k_opts[] = {
    {"--model", "M", "model name (data/models stem) or path to a JSON file (default llama3.1-8b)", NULL},
    {"--hf-config", "PATH", "a Hugging Face config.json instead of --model", NULL},
    {"--cluster", "C", "cluster name (data/clusters stem) or path (default h100-8)", NULL},
    {NULL, NULL, NULL, NULL},
};

static mp_cmd_spec k_spec = {"plan", "Enumerate device meshes for a model on a cluster and rank them.",
                             "[--model M | --hf-config PATH] [--cluster C]", k_opts, 0};

int mp_cmd_plan(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  mp_status st;
  const char *hf = mp_args_get(&k_spec, "--hf-config");
  const char *model = mp_args_get(&k_spec, "--model");
  if (hf && model) {
    fprintf(stderr, "meshplan plan: give --model or --hf-config, not both\n");
    return 2;
  }
  st = mp_model_load(&ctx, hf ? hf : (model ? model : "llama3.1-8b"), &m);
  if (st != MP_OK) return mp_cmd_fail(&ctx, st);
  const char *cl = mp_args_get(&k_spec, "--cluster");
  st = mp_cluster_load(&ctx, cl ? cl : "h100-8", &c);
  if (st != MP_OK) return mp_cmd_fail(&ctx, st);
  printf("model   %s: %s family, %.3g parameters (%.3g active), %lld layers, d_model %lld, "
         "%lld heads (%lld KV), d_ff %lld, vocab %lld\n",
         m.name, m.family == MP_FAMILY_GPT ? "gpt" : "llama", (double)mp_model_param_count(&m),
         (double)mp_model_active_param_count(&m), (long long)m.n_layers, (long long)m.d_model,
         (long long)m.n_heads, (long long)m.n_kv_heads, (long long)m.d_ff, (long long)m.vocab);
  printf("cluster %s: %d x %s (%d per node, %.0f GiB, %.0f bf16 TFLOP/s each)\n", c.name,
         mp_cluster_n_gpus(&c), c.gpu.name, c.gpus_per_node, c.gpu.mem_gib,
         c.gpu.peak_tflops[MP_DTYPE_BF16]);
  return 0;
}
