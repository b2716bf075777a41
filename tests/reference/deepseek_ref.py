#!/usr/bin/python3
"""DeepSeek-V2 safetensors round trip for the MLA models (tiny-mla: q_proj; tiny-mla-q: a
query latent): `meshplan train` -> `meshplan export` -> DeepSeek's names, config.json and
interleaved RoPE, checked against an independent forward of DeepSeek-V2.

For each model:
  1. `meshplan train --model M --steps 2 --checkpoint-dir CK0`: trained weights (norms moved
     away from 1, so their names are checked through the forward too);
  2. `meshplan export --checkpoint CK0 --out HF`: every tensor must carry DeepSeek-V2's name
     (model.layers.N.self_attn.q_proj or q_a_proj / q_a_layernorm / q_b_proj,
     kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; mlp.gate_proj... on the leading
     dense layer; mlp.gate, mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.* on the
     MoE layers), the set exactly the model's;
  3. `meshplan train --init-from HF --steps 0 --checkpoint-dir CK1 --dump-logits L
     --dump-data D` (no --model: the exported config.json is the model, read by meshplan's
     deepseek_v2 config reader): meshplan's logits of the imported weights on the first
     batch, and a checkpoint of them; `meshplan export --checkpoint CK1 --out HF2` must
     give HF's tensors back bit for bit (import and export are inverse);
  4. deepseek_v2_logits below, a float64 forward written from DeepSeek-V2's modeling code
     (deepseek-ai/DeepSeek-V2-Lite, modeling_deepseek.py: DeepseekV2Attention with
     apply_rotary_pos_emb, which views each rope head as (d/2, 2) and transposes it before
     rotate_half, i.e. rotates interleaved pairs (2i, 2i+1); softmax scale
     q_head_dim^-0.5 without rope_scaling; DeepseekV2MoE with softmax scores, greedy
     top-k, norm_topk_prob, routed_scaling_factor 1 and the shared experts added), run on
     HF's tensors, must give meshplan's logits:
        max |ours - reference| <= 1e-5 * max |reference|
     The rope rows are stored interleaved in HF and de-interleaved in meshplan
     (exec/runtime/hf_deepseek.c), so a wrong or missing permutation fails here;
  5. the same folder with DeepSeek's YaRN rope_scaling in config.json: `train --init-from`
     exits 2 naming rope_scaling (the runtime's RoPE is plain).
Run with Debian's /usr/bin/python3 (torch). Exits 1 on a mismatch.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_ref import find_meshplan, read_wfile, read_shard, rmsnorm, load_model_json  # noqa: E402
from hf_ref import read_safetensors, run  # noqa: E402

torch.set_default_dtype(torch.float64)
RTOL = 1e-5
SEQ, BATCH = 16, 2


def rope_interleaved(x, theta):
    """DeepSeek-V2's apply_rotary_pos_emb on x (B, T, h, d): de-interleave, rotate_half."""
    B, T, h, d = x.shape
    x = x.reshape(B, T, h, d // 2, 2).transpose(3, 4).reshape(B, T, h, d)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2) / d))
    freqs = torch.arange(T).reshape(T, 1) * inv.reshape(1, d // 2)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().reshape(1, T, 1, d), emb.sin().reshape(1, T, 1, d)
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos + rot * sin


def deepseek_v2_logits(W, cfg, ids):
    """The forward of DeepSeek-V2 (see the docstring) on HF's tensors W, float64."""
    F = torch.nn.functional
    P = {k: v.double() for k, v in W.items()}
    B, T = ids.shape
    nh, eps, theta = cfg["num_attention_heads"], cfg["rms_norm_eps"], cfg["rope_theta"]
    dn, dr, dv, kl = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    x = P["model.embed_tokens.weight"][ids]
    mask = torch.ones(T, T).tril().bool()
    for l in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % l
        h = rmsnorm(x, P[pre + "input_layernorm.weight"], eps)
        if cfg.get("q_lora_rank"):
            qa = rmsnorm(F.linear(h, P[pre + "self_attn.q_a_proj.weight"]), P[pre + "self_attn.q_a_layernorm.weight"], eps)
            q = F.linear(qa, P[pre + "self_attn.q_b_proj.weight"])
        else:
            q = F.linear(h, P[pre + "self_attn.q_proj.weight"])
        q = q.reshape(B, T, nh, dn + dr)
        ckv = F.linear(h, P[pre + "self_attn.kv_a_proj_with_mqa.weight"])
        lat, k_pe = ckv[..., :kl], ckv[..., kl:].reshape(B, T, 1, dr)
        kv = F.linear(rmsnorm(lat, P[pre + "self_attn.kv_a_layernorm.weight"], eps), P[pre + "self_attn.kv_b_proj.weight"])
        kv = kv.reshape(B, T, nh, dn + dv)
        query = torch.cat([q[..., :dn], rope_interleaved(q[..., dn:], theta)], dim=-1)
        key = torch.cat([kv[..., :dn], rope_interleaved(k_pe, theta).expand(B, T, nh, dr)], dim=-1)
        s = torch.einsum("bthd,bshd->bhts", query, key) * (dn + dr) ** -0.5
        a = torch.einsum("bhts,bshd->bthd", s.masked_fill(~mask, float("-inf")).softmax(-1), kv[..., dn:])
        x = x + F.linear(a.reshape(B, T, nh * dv), P[pre + "self_attn.o_proj.weight"])
        h = rmsnorm(x, P[pre + "post_attention_layernorm.weight"], eps)

        def mlp(z, p):
            return F.linear(F.silu(F.linear(z, P[p + "gate_proj.weight"])) * F.linear(z, P[p + "up_proj.weight"]),
                            P[p + "down_proj.weight"])
        if cfg.get("n_routed_experts") is None or l < cfg["first_k_dense_replace"]:
            x = x + mlp(h, pre + "mlp.")
            continue
        ht = h.reshape(B * T, -1)
        scores = F.linear(ht, P[pre + "mlp.gate.weight"]).softmax(-1)
        w, idx = scores.topk(cfg["num_experts_per_tok"], dim=-1)
        if cfg["num_experts_per_tok"] > 1 and cfg["norm_topk_prob"]:
            w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(ht)
        for e in range(cfg["n_routed_experts"]):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if len(rows):
                y = y.index_add(0, rows, mlp(ht[rows], pre + "mlp.experts.%d." % e) * w[rows, slot].unsqueeze(-1))
        if cfg.get("n_shared_experts"):
            y = y + mlp(ht, pre + "mlp.shared_experts.")
        x = x + y.reshape(B, T, -1)
    return F.linear(rmsnorm(x, P["model.norm.weight"], eps), P["lm_head.weight"])


def expected_names(m):
    """DeepSeek-V2's tensor names for meshplan model m (data/models)."""
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    mla, moe = m["mla"], m["moe"]
    for l in range(m["n_layers"]):
        p = "model.layers.%d." % l
        att = ["q_a_proj", "q_a_layernorm", "q_b_proj"] if mla.get("q_lora_rank") else ["q_proj"]
        att += ["kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"]
        names |= {p + "self_attn.%s.weight" % a for a in att}
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        proj = ("gate_proj", "up_proj", "down_proj")
        if l < moe["first_dense_layers"]:
            names |= {p + "mlp.%s.weight" % w for w in proj}
            continue
        names.add(p + "mlp.gate.weight")
        names |= {p + "mlp.experts.%d.%s.weight" % (e, w) for e in range(moe["n_experts"]) for w in proj}
        names |= {p + "mlp.shared_experts.%s.weight" % w for w in proj}
    return names


def check_model(meshplan, model, d):
    ok = True
    ck0, hf, ck1, hf2 = (os.path.join(d, model + n) for n in (".ck0", ".hf", ".ck1", ".hf2"))
    lpath, dpath = os.path.join(d, model + ".logits.bin"), os.path.join(d, model + ".data.bin")
    common = ["--seq", str(SEQ), "--micro-batch", str(BATCH), "--global-batch", str(BATCH), "--quiet"]
    run([meshplan, "train", "--model", model, "--steps", "2", "--lr", "3e-2", "--checkpoint-dir", ck0] + common)
    run([meshplan, "export", "--checkpoint", ck0, "--out", hf])
    run([meshplan, "train", "--init-from", hf, "--steps", "0", "--checkpoint-dir", ck1, "--dump-logits", lpath,
         "--dump-data", dpath] + common)
    run([meshplan, "export", "--checkpoint", ck1, "--out", hf2])
    W, W2 = (read_safetensors(os.path.join(p, "model.safetensors")) for p in (hf, hf2))
    cfg = json.load(open(os.path.join(hf, "config.json")))
    want = expected_names(load_model_json(model))
    if set(W) != want:
        print("  %s: names differ from DeepSeek-V2's: extra %s, missing %s" % (model, sorted(set(W) - want)[:6],
                                                                              sorted(want - set(W))[:6]))
        ok = False
    if cfg["architectures"] != ["DeepseekV2ForCausalLM"] or cfg["rope_scaling"] is not None:
        print("  %s: config.json is not DeepSeek-V2's without rope_scaling: %s" % (model, cfg["architectures"]))
        ok = False
    for k in sorted(set(W) & set(W2)):
        if not torch.equal(W[k], W2[k]):
            print("  %s: tensor %s changed through import and export" % (model, k))
            ok = False
    # a config whose rope_scaling the runtime does not apply (DeepSeek's YaRN) is refused by name
    yarn = os.path.join(d, model + ".yarn")
    os.makedirs(yarn)
    os.link(os.path.join(hf, "model.safetensors"), os.path.join(yarn, "model.safetensors"))
    json.dump(dict(cfg, rope_scaling={"type": "yarn", "factor": 40}), open(os.path.join(yarn, "config.json"), "w"))
    r = subprocess.run([meshplan, "train", "--init-from", yarn, "--steps", "0"] + common, capture_output=True, text=True)
    if r.returncode != 2 or "rope_scaling (type yarn) is not implemented" not in r.stderr:
        print("  %s: --init-from a config with YaRN rope_scaling not refused by name: exit %d, %s" % (
            model, r.returncode, r.stderr.strip()))
        ok = False
    ours = read_wfile(lpath)["logits"]
    toks = read_shard(dpath)
    ids = torch.from_numpy(np.stack([toks[i * SEQ:i * SEQ + SEQ] for i in range(BATCH)]))
    ref = deepseek_v2_logits(W, cfg, ids)
    err, scale = (ours - ref).abs().max().item(), ref.abs().max().item()
    good = err <= RTOL * scale
    print("  %s: %d tensors with DeepSeek-V2's names, logits vs DeepSeek-V2's forward max diff %.2e of %.2e: %s" % (
        model, len(W), err, scale, "match" if good else "MISMATCH"))
    return ok and good


def main():
    meshplan = find_meshplan()
    with tempfile.TemporaryDirectory() as d:
        ok = all([check_model(meshplan, m, d) for m in ("tiny-mla", "tiny-mla-q")])
    print("deepseek_ref: %s" % ("all match" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
