#!/usr/bin/python3
"""Hugging Face round trip: safetensors in -> `meshplan train` 0 steps -> `meshplan export`
-> transformers' LlamaForCausalLM, whose logits must equal meshplan's forward.

  1. writes a tiny Llama (transformers' LlamaForCausalLM, seeded random weights, RMSNorm
     weights perturbed away from 1 so the norms' names are checked too) with
     save_pretrained(safe_serialization=True): config.json + model.safetensors;
  2. `meshplan train --init-from FOLDER --steps 0 --checkpoint-dir CK --dump-logits L
     --dump-data D` (no --model: the config.json is the model): meshplan's logits of the
     starting weights on the first batch, and a checkpoint of them;
  3. `meshplan export --checkpoint CK --out OUT`;
  4. loads OUT with LlamaForCausalLM.from_pretrained (fp32, CPU, eager attention) and
     compares: every exported tensor bit for bit with the original (fp32 in, fp32 out),
     the config's dims, and the logits of the same tokens:
        max |ours - transformers| <= 1e-5 * max |transformers|
     (fp32 on both sides; the two forwards sum in different orders, so equality is to
     rounding, far below 1e-5 of the logits' scale).
The RoPE check is in the logits: transformers rotates dim i with dim i + head_dim/2
(rotate_half), as meshplan's kernel does, so q_proj/k_proj need no permutation. The same
round trip then runs for an MoE with transformers' MixtralForCausalLM (experts one by one
as w1/w3/w2, the router as block_sparse_moe.gate).

The logits are also checked against the independent float64 Llama forward below, run on
the exported safetensors; when transformers does not import (scripts/setup installs
4.46.3 for Debian's torch 1.13) that forward is the only reference, and the script says
so.

What else a transformers user expects of the folder:
  - config.json's bos_token_id and eos_token_id: null for synthetic data (no tokenizer,
    so never LlamaConfig's defaults 1 and 2);
  - `export --dtype bf16`: every tensor is torch's own fp32 -> bfloat16 rounding of the
    fp32 export, bit for bit, config.json says bfloat16 (torch_dtype="auto" loads bf16),
    and transformers' logits on it equal the float64 forward of the same bf16 weights;
  - the tokenizer: scripts/tokenize trains a BPE on text and writes tokenizer.json beside
    the shards; a model trained on them exports it, AutoTokenizer loads the folder and
    encodes text to the tokenizer's own ids, and the tokenizer, config.json and the
    generation config agree on <|endoftext|> as bos and eos.
Exits 1 on a mismatch.
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_ref import find_meshplan, read_wfile, read_shard  # noqa: E402

RTOL = 1e-5
CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=4, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
           tie_word_embeddings=False)
SEQ, BATCH = 16, 2

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    HAVE_TF = True
except ImportError:
    HAVE_TF = False


def read_safetensors(path, dtype="F32"):
    """The format read by hand (8-byte header length, JSON header, data): every tensor of
    dtype F32 (as float32) or BF16 (its raw bits, as int16)."""
    b = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", b, 0)
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == dtype, (k, v["dtype"])
        s, e = v["data_offsets"]
        np_type, size = ("<f4", 4) if dtype == "F32" else ("<i2", 2)
        out[k] = torch.from_numpy(np.frombuffer(b, dtype=np_type, count=(e - s) // size, offset=8 + n + s).copy()
                                  .reshape(v["shape"]))
    return out


def write_hf_model(folder):
    """transformers' own writer when it imports; else the same tensors by hand."""
    torch.manual_seed(0)
    if HAVE_TF:
        cfg = LlamaConfig(**CFG, attn_implementation="eager")
        m = LlamaForCausalLM(cfg).float().eval()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith("layernorm.weight") or n == "model.norm.weight":
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        m.save_pretrained(folder, safe_serialization=True)
        return {k: v.detach().clone() for k, v in m.state_dict().items()}
    from safetensors.torch import save_file
    C, F, L, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["num_hidden_layers"], CFG["vocab_size"]
    q, kv = CFG["num_attention_heads"] * CFG["head_dim"], CFG["num_key_value_heads"] * CFG["head_dim"]
    sd = {"model.embed_tokens.weight": 0.02 * torch.randn(V, C), "model.norm.weight": 1 + 0.1 * torch.randn(C),
          "lm_head.weight": torch.randn(V, C) / C ** 0.5}
    for l in range(L):
        p = "model.layers.%d." % l
        sd.update({p + "self_attn.q_proj.weight": torch.randn(q, C) / C ** 0.5,
                   p + "self_attn.k_proj.weight": torch.randn(kv, C) / C ** 0.5,
                   p + "self_attn.v_proj.weight": torch.randn(kv, C) / C ** 0.5,
                   p + "self_attn.o_proj.weight": torch.randn(C, q) / q ** 0.5,
                   p + "mlp.gate_proj.weight": torch.randn(F, C) / C ** 0.5,
                   p + "mlp.up_proj.weight": torch.randn(F, C) / C ** 0.5,
                   p + "mlp.down_proj.weight": torch.randn(C, F) / F ** 0.5,
                   p + "input_layernorm.weight": 1 + 0.1 * torch.randn(C),
                   p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(C)})
    os.makedirs(folder, exist_ok=True)
    save_file(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    json.dump(dict(CFG, architectures=["LlamaForCausalLM"], model_type="llama"),
              open(os.path.join(folder, "config.json"), "w"))
    return sd


def llama_logits_f64(sd, cfg, ids):
    """An independent Llama forward (float64) from Hugging Face-named tensors."""
    F = torch.nn.functional
    P = {k: v.double() for k, v in sd.items()}
    B, T = ids.shape
    nh, nkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    half = hd // 2
    inv = cfg["rope_theta"] ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64).reshape(T, 1) * inv.reshape(1, half)
    cos, sin = torch.cos(ang).reshape(1, T, 1, half), torch.sin(ang).reshape(1, T, 1, half)

    def rope(x):
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    x = P["model.embed_tokens.weight"][ids]
    mask = torch.ones(T, T).tril().bool()
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        n1 = norm(x, P[p + "input_layernorm.weight"])
        q = rope(F.linear(n1, P[p + "self_attn.q_proj.weight"]).reshape(B, T, nh, hd))
        k = rope(F.linear(n1, P[p + "self_attn.k_proj.weight"]).reshape(B, T, nkv, hd))
        v = F.linear(n1, P[p + "self_attn.v_proj.weight"]).reshape(B, T, nkv, hd)
        k = k.repeat_interleave(nh // nkv, dim=2)
        v = v.repeat_interleave(nh // nkv, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / hd ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, nh * hd)
        x = x + F.linear(o, P[p + "self_attn.o_proj.weight"])
        n2 = norm(x, P[p + "post_attention_layernorm.weight"])
        g = F.linear(n2, P[p + "mlp.gate_proj.weight"])
        x = x + F.linear(F.silu(g) * F.linear(n2, P[p + "mlp.up_proj.weight"]), P[p + "mlp.down_proj.weight"])
    return F.linear(norm(x, P["model.norm.weight"]), P["lm_head.weight"])


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("FAILED: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        sys.exit(1)
    return r.stdout


def main():
    meshplan = find_meshplan()
    ok = True
    with tempfile.TemporaryDirectory() as d:
        hf, ck, out = (os.path.join(d, n) for n in ("hf", "ck", "out"))
        orig = write_hf_model(hf)
        lpath, dpath = os.path.join(d, "logits.bin"), os.path.join(d, "data.bin")
        print(run([meshplan, "train", "--init-from", hf, "--steps", "0", "--seq", str(SEQ), "--micro-batch",
                   str(BATCH), "--global-batch", str(BATCH), "--checkpoint-dir", ck, "--dump-logits", lpath,
                   "--dump-data", dpath, "--quiet"]).strip())
        print(run([meshplan, "export", "--checkpoint", ck, "--out", out]).strip())
        ours = read_wfile(lpath)["logits"]  # (B, T, V), float64 copies of fp32
        toks = read_shard(dpath)
        ids = torch.from_numpy(np.stack([toks[i * SEQ:i * SEQ + SEQ] for i in range(BATCH)]))
        exported = read_safetensors(os.path.join(out, "model.safetensors"))
        cfg = json.load(open(os.path.join(out, "config.json")))
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta"):
            if cfg[k] != CFG[k]:
                print("  config.json %s = %s, want %s" % (k, cfg[k], CFG[k]))
                ok = False
        if set(exported) != set(orig):
            print("  exported names differ: extra %s, missing %s" % (sorted(set(exported) - set(orig)),
                                                                     sorted(set(orig) - set(exported))))
            ok = False
        for k in sorted(set(exported) & set(orig)):
            if not torch.equal(exported[k], orig[k].float()):
                print("  tensor %s changed in the round trip (max diff %.3g)" % (k, (exported[k] - orig[k]).abs().max()))
                ok = False
        refs = [("the float64 Llama forward of hf_ref.py", llama_logits_f64(exported, cfg, ids))]
        if HAVE_TF:
            m = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").eval()
            with torch.no_grad():
                refs.append(("transformers %s LlamaForCausalLM" % transformers.__version__, m(ids).logits.double()))
        else:
            print("  transformers does not import: the float64 forward is the only reference")
        for who, ref in refs:
            scale = ref.abs().max().item()
            err = (ours - ref).abs().max().item()
            print("  logits vs %s: max |diff| %.3g, max |logit| %.3g (tolerance %.0e relative)" % (who, err, scale,
                                                                                                 RTOL))
            if not err <= RTOL * scale:
                ok = False
        if (cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)) != (None, None):
            print("  config.json: bos/eos ids %s, %s for synthetic data, want null" % (cfg.get("bos_token_id", "absent"),
                                                                                   cfg.get("eos_token_id", "absent")))
            ok = False
        if HAVE_TF:
            ok = bf16_round_trip(meshplan, d, ck, exported, ids) and ok
            ok = tokenizer_round_trip(meshplan, d) and ok
        ok = mixtral_round_trip(meshplan, d) and ok
    print("hf_ref: %s" % ("round trip matches" if ok else "MISMATCH"))
    return 0 if ok else 1


def bf16_round_trip(meshplan, d, ck, fp32, ids):
    """export --dtype bf16 of the same checkpoint: torch's rounding of the fp32 export, bit for
    bit; transformers' logits on it against the float64 forward of those bf16 weights."""
    out = os.path.join(d, "out_bf16")
    run([meshplan, "export", "--checkpoint", ck, "--out", out, "--dtype", "bf16"])
    bits = read_safetensors(os.path.join(out, "model.safetensors"), "BF16")
    cfg = json.load(open(os.path.join(out, "config.json")))
    ok = cfg["torch_dtype"] == "bfloat16" and set(bits) == set(fp32)
    if not ok:
        print("  bf16: config.json torch_dtype %s, names %s" % (cfg["torch_dtype"], sorted(set(bits) ^ set(fp32))))
    for k in sorted(set(bits) & set(fp32)):
        want = fp32[k].to(torch.bfloat16).view(torch.int16)
        if not torch.equal(bits[k], want):
            print("  bf16: tensor %s is not torch's rounding of the fp32 export (%d elements differ)" %
                  (k, int((bits[k] != want).sum())))
            ok = False
    weights = {k: v.view(torch.bfloat16).float() for k, v in bits.items()}
    ref = llama_logits_f64(weights, cfg, ids)
    m = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        got = m(ids).logits.double()
    scale, err = ref.abs().max().item(), (got - ref).abs().max().item()
    print("  bf16 export: transformers %s logits vs the float64 forward of the bf16 weights: max |diff| %.3g, max "
          "|logit| %.3g" % (transformers.__version__, err, scale))
    auto = LlamaForCausalLM.from_pretrained(out, torch_dtype="auto")
    if auto.dtype != torch.bfloat16:
        print("  bf16: torch_dtype='auto' loads %s" % auto.dtype)
        ok = False
    return ok and err <= RTOL * scale


def tokenizer_round_trip(meshplan, d):
    """scripts/tokenize -> train on its shards -> export: AutoTokenizer loads the folder and
    agrees with the tokenizer.json it came from, and so do config.json and generation."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    files = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p) and not
                   os.path.islink(p))[:6]
    if not files:
        print("  tokenizer: /usr/share/common-licenses holds no file to tokenize")
        return False
    data, ck, out = (os.path.join(d, n) for n in ("tok_data", "tok_ck", "tok_out"))
    run([os.path.join(HERE, "..", "..", "scripts", "tokenize"), "--input"] + files + ["--out", data, "--vocab-size",
                                                                                      "300"])
    model = os.path.join(d, "text-512.json")
    json.dump({"name": "text-512", "family": "llama", "vocab": 512, "d_model": 64, "n_layers": 2, "n_heads": 4,
               "n_kv_heads": 2, "head_dim": 16, "d_ff": 192, "max_seq": 64}, open(model, "w"))
    run([meshplan, "train", "--model", model, "--data", os.path.join(data, "train_*.bin"), "--steps", "2", "--seq",
         "16", "--micro-batch", "2", "--global-batch", "2", "--checkpoint-dir", ck, "--quiet"])
    print("  " + run([meshplan, "export", "--checkpoint", ck, "--out", out]).strip().replace("\n", "\n  "))
    ref = Tokenizer.from_file(os.path.join(data, "tokenizer.json"))
    eot = ref.token_to_id("<|endoftext|>")
    tok = AutoTokenizer.from_pretrained(out)
    text = "Permission is hereby granted, free of charge, to any person"
    ids = tok.encode(text, add_special_tokens=False)
    cfg = json.load(open(os.path.join(out, "config.json")))
    m = AutoModelForCausalLM.from_pretrained(out)
    got = (ids == ref.encode(text, add_special_tokens=False).ids, tok.decode(ids) == text, tok.eos_token_id,
           tok.bos_token_id, cfg["eos_token_id"], cfg["bos_token_id"], m.generation_config.eos_token_id)
    want = (True, True, eot, eot, eot, eot, eot)
    print("  tokenizer: AutoTokenizer %s the tokenizer.json's ids; <|endoftext|> = %d as bos/eos in the tokenizer, "
          "config.json and generation config: %s" % ("encodes to" if got[0] else "DIFFERS from", eot, got[2:] == want[2:]))
    return got == want


def mixtral_round_trip(meshplan, d):
    """The same for an MoE: transformers' MixtralForCausalLM (8 experts, top 2, every layer
    MoE), whose experts are meshplan's [E, F, C] tensors one expert at a time (w1 gate, w3
    up, w2 down) and whose router is block_sparse_moe.gate."""
    if not HAVE_TF:
        print("  Mixtral: transformers does not import; the MoE round trip needs its MixtralForCausalLM")
        return False
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(1)
    cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=8, max_position_embeddings=64,
                        rms_norm_eps=1e-5, rope_theta=10000.0, num_local_experts=8, num_experts_per_tok=2,
                        tie_word_embeddings=False, attn_implementation="eager")
    hf, ck, out = (os.path.join(d, n) for n in ("mix_hf", "mix_ck", "mix_out"))
    MixtralForCausalLM(cfg).float().eval().save_pretrained(hf, safe_serialization=True)
    lpath, dpath = os.path.join(d, "mix_logits.bin"), os.path.join(d, "mix_data.bin")
    run([meshplan, "train", "--init-from", hf, "--steps", "0", "--seq", str(SEQ), "--micro-batch", str(BATCH),
         "--global-batch", str(BATCH), "--checkpoint-dir", ck, "--dump-logits", lpath, "--dump-data", dpath, "--quiet"])
    run([meshplan, "export", "--checkpoint", ck, "--out", out])
    ours = read_wfile(lpath)["logits"]
    toks = read_shard(dpath)
    ids = torch.from_numpy(np.stack([toks[i * SEQ:i * SEQ + SEQ] for i in range(BATCH)]))
    m = MixtralForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = m(ids).logits.double()
    scale, err = ref.abs().max().item(), (ours - ref).abs().max().item()
    print("  Mixtral logits vs transformers %s MixtralForCausalLM: max |diff| %.3g, max |logit| %.3g" %
          (transformers.__version__, err, scale))
    return err <= RTOL * scale


if __name__ == "__main__":
    sys.exit(main())
