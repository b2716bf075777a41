#!/usr/bin/python3
"""PyTorch reference for the tiny models trained by `meshplan train` (exec/runtime).

For each of tiny-dense, tiny-moe, tiny-mla and tiny-mla-q (and a few AC modes / micro-batch
splits):
  1. runs `meshplan train` on one rank with --dump-weights (initial full weights),
     --dump-grads (gradients of step 1, before clipping), --dump-losses (per-step loss)
     and --dump-data (the token corpus, an llm.c shard);
  2. loads the same weights into an independent PyTorch implementation (float64) of the
     same model and the same step (below), feeds the same batches, and
  3. compares per-step losses and every step-1 gradient.

The model (llama family, as exec/model.h and kernels/ops.h define it):
  x = tok_embeddings[tokens]
  per block:  h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rmsnorm(x)
              x = h + mlp(rmsnorm(h))
    rmsnorm(x) = x / sqrt(mean(x^2) + eps) * w
    rope: HF "rotate_half" (dim i pairs with i + hd/2), angle = pos * theta^(-2i/hd)
    attention: causal, grouped-query (query head h reads kv head h // (nh/nkv)), 1/sqrt(hd)
    dense mlp: down(silu(gate(x)) * up(x))
    multi-head latent attention (tiny-mla, tiny-mla-q; mla_attention below) follows Hugging
      Face transformers' DeepseekV3Attention (modeling_deepseek_v3.py, v4.57) with
      rope_interleave false: q = q_b_proj(q_a_layernorm(q_a_proj(n1))) or q_proj(n1), per
      head [qk_nope | qk_rope]; kv_a_proj_with_mqa(n1) = [latent | k_pe]; kv_b_proj(
      kv_a_layernorm(latent)) per head [k_nope | v]; RoPE (rotate_half, over qk_rope_head_dim)
      on q's rope part and on k_pe, one key head shared by all heads; scale
      1/sqrt(qk_nope + qk_rope); o_proj over n_heads x v_head_dim. The latent norms take
      norm_eps (DeepSeek's configs set rms_norm_eps 1e-6, the latent norms' default there)
    MoE mlp (from layer first_dense_layers on, every layer_freq-th; dense before):
             probs = softmax(router(x)); top-k experts (renormalised when norm_topk_prob);
             sum_j w_j expert_{e_j}(x) + shared_expert(x);
             aux = E * sum_e f_e P_e, f_e = #tokens whose top-k holds e / N (no gradient),
             P_e = mean_n probs[n, e]
    capacity (train --moe-capacity-factor cf; capacity_keep below), Megatron-Core core_v0.14's
             apply_router_token_dropping with drop policy probs, written from its definition:
             the routing weights as a (tokens, experts) matrix, zero where not routed; per
             expert the ceil((N k / E) cf) rows of the largest weight kept (a stable sort:
             equal weights keep the lower token, the runtime's rule), the other assignments
             dropped: they add nothing to the token's output and their weight has no
             gradient; the kept weights are not renormalised; aux reads the routing before
             the drop. The runtime's --metrics expert_loads of step 1 must equal this
             reference's routed and dropped counts summed over the step's micro-batches.
  logits = output(rmsnorm(x));  loss = mean CE + aux_loss_coef * sum over MoE layers of aux
  A step averages the loss over its micro-batches (the runtime's micro-batch size: the aux
  term is per micro-batch), clips the global grad norm to 1.0 (clip_grad_norm_), then
  torch.optim.AdamW(lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1 on tensors of >= 2
  dims, 0 on norms).
Batches (exec/runtime/dataset.h): the corpus holds S = (n_tokens - 1) // seq sequences,
sequence i the seq+1 tokens from i * seq; sequence g of the run is sequence g mod S (no
shuffle); step s uses sequences s*G .. s*G+G-1.

Tolerances (fp32 runtime vs float64 reference): losses |got - want| <= 1e-5 * |want| (the
design's target) on every step compared; gradients: per tensor, the norm of the difference
<= 1e-5 * the norm of the reference (a relative error of the whole tensor; elementwise
relative error is meaningless for entries that are ~0), and elementwise
|got - want| <= 1e-5 * max|want| + 1e-5 * |want|.

Run with Debian's /usr/bin/python3 (torch 1.13). Exits 1 on a mismatch.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RTOL = 1e-5


def find_meshplan():
    p = os.environ.get("MP_MESHPLAN")
    if p and os.path.exists(p):
        return p
    subprocess.run(["bazel", "build", "//app:meshplan"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT, check=True, capture_output=True, text=True)
    return os.path.join(out.stdout.strip(), "app", "meshplan")


def read_wfile(path):
    """Weight file (exec/runtime/weights.h): 'MPWT', version 1, count, records."""
    b = open(path, "rb").read()
    assert b[:4] == b"MPWT", "bad magic"
    ver, count = struct.unpack_from("<II", b, 4)
    assert ver == 1, ver
    pos, out = 12, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", b, pos); pos += 4
        name = b[pos:pos + nl].decode(); pos += nl
        (nd,) = struct.unpack_from("<I", b, pos); pos += 4
        shape = struct.unpack_from("<%dq" % nd, b, pos); pos += 8 * nd
        n = int(np.prod(shape))
        out[name] = torch.from_numpy(np.frombuffer(b, dtype="<f4", count=n, offset=pos).reshape(shape).astype(np.float64))
        pos += 4 * n
    assert pos == len(b), "trailing bytes"
    return out


def read_shard(path):
    b = open(path, "rb").read()
    hdr = np.frombuffer(b, dtype="<i4", count=256)
    assert hdr[0] == 20240520 and hdr[1] == 1
    return np.frombuffer(b, dtype="<u2", count=int(hdr[2]), offset=1024).astype(np.int64)


def load_model_json(name):
    return json.load(open(os.path.join(ROOT, "data", "models", name + ".json")))


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x: (B, T, h, hd)
    B, T, h, hd = x.shape
    half = hd // 2
    inv = theta ** (-2.0 * torch.arange(half) / hd)
    ang = torch.arange(T).reshape(T, 1) * inv.reshape(1, half)
    cos, sin = torch.cos(ang).reshape(1, T, 1, half), torch.sin(ang).reshape(1, T, 1, half)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def mla_attention(P, pre, cfg, n1):
    """DeepseekV3Attention (see the docstring) on n1 (B, T, C); returns o_proj's input."""
    F = torch.nn.functional
    B, T = n1.shape[0], n1.shape[1]
    mla, nh, eps, theta = cfg["mla"], cfg["n_heads"], cfg["norm_eps"], cfg["rope_theta"]
    dn, dr, dv, kl = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
    if mla.get("q_lora_rank", 0):
        qa = F.linear(n1, P[pre + "attention.q_a_proj.weight"])
        q = F.linear(rmsnorm(qa, P[pre + "attention.q_a_layernorm.weight"], eps), P[pre + "attention.q_b_proj.weight"])
    else:
        q = F.linear(n1, P[pre + "attention.q_proj.weight"])
    q = q.reshape(B, T, nh, dn + dr)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    kva = F.linear(n1, P[pre + "attention.kv_a_proj_with_mqa.weight"])
    lat, k_pe = kva[..., :kl], kva[..., kl:]
    kv = F.linear(rmsnorm(lat, P[pre + "attention.kv_a_layernorm.weight"], eps), P[pre + "attention.kv_b_proj.weight"])
    kv = kv.reshape(B, T, nh, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    q_pe, k_pe = rope(q_pe, theta), rope(k_pe.reshape(B, T, 1, dr), theta)
    q = torch.cat([q_nope, q_pe], dim=-1)
    k = torch.cat([k_nope, k_pe.expand(B, T, nh, dr)], dim=-1)
    mask = torch.ones(T, T).tril().bool()
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(dn + dr)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, nh * dv)


def is_moe_layer(cfg, l):
    moe = cfg.get("moe")
    if not moe:
        return False
    first, freq = moe.get("first_dense_layers", 0), moe.get("layer_freq", 1)
    return l >= first and l % freq == 0


def swiglu(x, g, u, d):
    return torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, g)) *
                                      torch.nn.functional.linear(x, u), d)


def gqa_attention(P, pre, cfg, n1, nh, nkv, hd):
    """Grouped-query attention with o_proj (the llama family's)."""
    F = torch.nn.functional
    B, T = n1.shape[0], n1.shape[1]
    theta = cfg["rope_theta"]
    mask = torch.ones(T, T).tril().bool()
    q = F.linear(n1, P[pre + "attention.q_proj.weight"]).reshape(B, T, nh, hd)
    k = F.linear(n1, P[pre + "attention.k_proj.weight"]).reshape(B, T, nkv, hd)
    v = F.linear(n1, P[pre + "attention.v_proj.weight"]).reshape(B, T, nkv, hd)
    q, k = rope(q, theta), rope(k, theta)
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    s = s.masked_fill(~mask, float("-inf"))
    a = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, nh * hd)
    return F.linear(a, P[pre + "attention.o_proj.weight"])


def capacity_keep(w, idx, E, cf):
    """w, idx: (N, k) routing weights and experts. Returns keep (N, k) bool, and the
    assignments routed to and dropped from each expert (E,)."""
    N, K = idx.shape
    cap = math.ceil((N * K / E) * cf)
    probs = torch.zeros(N, E).scatter(1, idx, w.detach())
    routed = torch.zeros(N, E, dtype=torch.bool).scatter(1, idx, True)
    mask = torch.zeros(N, E, dtype=torch.bool)
    for e in range(E):
        top = torch.sort(probs[:, e], descending=True, stable=True).indices[:cap]
        mask[top, e] = True
    final = routed & mask
    return final.gather(1, idx), routed.sum(0), (routed & ~mask).sum(0)


def forward(P, cfg, tokens, cf=None, loads=None):
    """tokens: (B, T+1) int64; cf: the experts' capacity factor (None: dropless); loads: a
    dict layer -> [routed (E,), dropped (E,)] added to. Returns (ce, aux_term)."""
    F = torch.nn.functional
    B, T = tokens.shape[0], tokens.shape[1] - 1
    inp, tgt = tokens[:, :T], tokens[:, 1:]
    C, nh = cfg["d_model"], cfg["n_heads"]
    nkv = cfg.get("n_kv_heads", nh)
    hd = cfg.get("head_dim", C // nh)
    eps, theta = cfg["norm_eps"], cfg["rope_theta"]
    moe = cfg.get("moe")
    x = P["tok_embeddings.weight"][inp]
    aux_total = torch.zeros(())
    for l in range(cfg["n_layers"]):
        pre = "layers.%d." % l
        n1 = rmsnorm(x, P[pre + "attention_norm.weight"], eps)
        if "mla" in cfg:
            h = x + F.linear(mla_attention(P, pre, cfg, n1), P[pre + "attention.o_proj.weight"])
        else:
            h = x + gqa_attention(P, pre, cfg, n1, nh, nkv, hd)
        n2 = rmsnorm(h, P[pre + "ffn_norm.weight"], eps)
        if not is_moe_layer(cfg, l):
            out = swiglu(n2, P[pre + "mlp.gate_proj.weight"], P[pre + "mlp.up_proj.weight"],
                         P[pre + "mlp.down_proj.weight"])
        else:
            E, K = moe["n_experts"], moe["top_k"]
            xt = n2.reshape(B * T, C)
            probs = F.linear(xt, P[pre + "moe.router.weight"]).softmax(-1)
            w, idx = probs.topk(K, dim=-1)
            if moe.get("norm_topk_prob"):
                w = w / w.sum(-1, keepdim=True)
            keep = torch.ones_like(idx, dtype=torch.bool)
            if cf is not None:
                keep, n_routed, n_dropped = capacity_keep(w, idx, E, cf)
                if loads is not None:
                    acc = loads.setdefault(l, [torch.zeros(E, dtype=torch.int64), torch.zeros(E, dtype=torch.int64)])
                    acc[0] += n_routed
                    acc[1] += n_dropped
            eg, eu, ed = (P[pre + "moe.experts.gate_proj.weight"], P[pre + "moe.experts.up_proj.weight"],
                          P[pre + "moe.experts.down_proj.weight"])
            y = torch.zeros_like(xt)
            for e in range(E):
                rows, slot = ((idx == e) & keep).nonzero(as_tuple=True)
                if len(rows) == 0:
                    continue
                ye = swiglu(xt[rows], eg[e], eu[e], ed[e])
                y = y.index_add(0, rows, ye * w[rows, slot].unsqueeze(-1))
            if moe.get("n_shared_experts", 0) > 0:
                y = y + swiglu(xt, P[pre + "moe.shared_expert.gate_proj.weight"],
                               P[pre + "moe.shared_expert.up_proj.weight"],
                               P[pre + "moe.shared_expert.down_proj.weight"])
            out = y.reshape(B, T, C)
            f = torch.zeros(E)
            for e in range(E):
                f[e] = (idx == e).any(-1).double().sum() / (B * T)
            aux_total = aux_total + E * (f.detach() * probs.mean(0)).sum()
        x = h + out
    logits = F.linear(rmsnorm(x, P["norm.weight"], eps), P["output.weight"])
    ce = F.cross_entropy(logits.reshape(B * T, -1), tgt.reshape(-1))
    coef = moe["aux_loss_coef"] if moe else 0.0
    return ce, coef * aux_total


def batch(tokens, step, G, T):
    S = (len(tokens) - 1) // T
    rows = []
    for j in range(G):
        g = step * G + j
        start = (g % S) * T
        rows.append(tokens[start:start + T + 1])
    return torch.from_numpy(np.stack(rows))


def check_loads(name, got, want):
    """The runtime's step-1 expert_loads (--metrics) against the reference's; the case must
    drop some assignments, or it would not test the drop."""
    ok = len(got) == len(want)
    for g in got:
        w = want.get(g["layer"])
        ok = ok and w is not None and g["routed"] == w[0].tolist() and g["dropped"] == w[1].tolist()
    dropped = sum(int(w[1].sum()) for w in want.values())
    if not ok or dropped == 0:
        print("  %s expert loads: runtime %s, reference %s (%d dropped)" % (
            name, got, {l: [w[0].tolist(), w[1].tolist()] for l, w in want.items()}, dropped))
        return False
    return True


def check_case(meshplan, model, steps, seq, mb, gb, ac, lr, cf=None):
    cfg = load_model_json(model)
    with tempfile.TemporaryDirectory() as d:
        f = {k: os.path.join(d, k) for k in ("w.bin", "g.bin", "l.json", "data.bin", "m.jsonl")}
        cmd = [meshplan, "train", "--model", model, "--steps", str(steps), "--seq", str(seq),
               "--micro-batch", str(mb), "--global-batch", str(gb), "--ac", ac, "--lr", str(lr),
               "--quiet", "--dump-weights", f["w.bin"], "--dump-grads", f["g.bin"],
               "--dump-losses", f["l.json"], "--dump-data", f["data.bin"], "--metrics", f["m.jsonl"]]
        if cf is not None:
            cmd += ["--moe-capacity-factor", str(cf)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print("meshplan train failed:", r.stdout, r.stderr)
            return False
        W0 = read_wfile(f["w.bin"])
        G1 = read_wfile(f["g.bin"])
        got_losses = json.load(open(f["l.json"]))["losses"]
        data = read_shard(f["data.bin"])
        got_loads = json.loads(open(f["m.jsonl"]).readline()).get("expert_loads", [])
    params = {k: torch.nn.Parameter(v.clone()) for k, v in W0.items()}
    decay = [p for p in params.values() if p.dim() >= 2]
    nodecay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    ok = True
    name = "%s ac=%s B=%d G=%d%s" % (model, ac, mb, gb, "" if cf is None else " capacity %g" % cf)
    for s in range(steps):
        opt.zero_grad()
        toks = batch(data, s, gb, seq)
        n_micro = gb // mb
        total = 0.0
        loads = {}
        for m in range(n_micro):
            ce, aux = forward(params, cfg, toks[m * mb:(m + 1) * mb], cf, loads)
            loss = (ce + aux) / n_micro
            loss.backward()
            total += loss.item()
        rel = abs(got_losses[s] - total) / abs(total)
        if rel > RTOL:
            print("  %s step %d: loss %.9g, reference %.9g (rel %.2e > %.0e)" % (name, s + 1, got_losses[s], total,
                                                                                rel, RTOL))
            ok = False
        if s == 0 and cf is not None:
            ok = check_loads(name, got_loads, loads) and ok
        if s == 0:
            worst = 0.0
            for k, p in params.items():
                want, got = p.grad, G1[k]
                err = (got - want).norm().item() / max(want.norm().item(), 1e-30)
                el = ((got - want).abs() - (RTOL * want.abs().max() + RTOL * want.abs())).max().item()
                worst = max(worst, err)
                if err > RTOL or el > 0:
                    print("  %s grad %s: relative error %.2e (tol %.0e), elementwise excess %.2e" % (name, k, err,
                                                                                                     RTOL, el))
                    ok = False
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
    print("  %s: %d steps, losses %s .. %s, %s" % (name, steps, "%.6f" % got_losses[0], "%.6f" % got_losses[-1],
                                                 "match" if ok else "MISMATCH"))
    return ok


def main():
    meshplan = find_meshplan()
    cases = [
        ("tiny-dense", 4, 32, 2, 2, "none", 3e-3),
        ("tiny-dense", 3, 32, 1, 2, "full", 3e-3),   # two micro-batches, full AC
        ("tiny-moe", 4, 32, 2, 2, "none", 3e-3),
        ("tiny-moe", 3, 32, 1, 2, "selective-core", 3e-3),
        ("tiny-mla", 4, 32, 2, 2, "none", 3e-3),
        ("tiny-mla", 3, 32, 1, 2, "full", 3e-3),
        ("tiny-mla-q", 4, 32, 2, 2, "none", 3e-3),
        ("tiny-mla-q", 3, 32, 1, 2, "selective-core", 3e-3),
        # the experts' capacity: one micro-batch; two (the capacity per micro-batch) with
        # full AC (the drop recomputed in the backward); MLA with its dense first layer
        ("tiny-moe", 4, 32, 2, 2, "none", 3e-3, 1.0),
        ("tiny-moe", 3, 32, 1, 2, "full", 3e-3, 1.25),
        ("tiny-mla", 3, 32, 2, 2, "none", 3e-3, 1.0),
    ]
    ok = True
    for c in cases:
        ok = check_case(meshplan, *c) and ok
    print("model_ref: %s" % ("all match" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
