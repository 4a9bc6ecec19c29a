#!/usr/bin/python3
"""The GPT of examples/gpt_model.h in PyTorch: the cross-check of the C model and the baseline of
`make bench-torch`.

Same architecture and names as gpt_model.h: byte vocabulary, token + position embeddings,
pre-LayerNorm blocks (causal self-attention with fused c_attn, GELU MLP with the tanh
approximation, GPT-2's "gelu_new"), final LayerNorm, LM head tied to wte; parameters named as the
Hugging Face GPT-2 state dict, every matrix in nn.Linear layout (out, in), so the C model's full
safetensors checkpoint (fsdp_save_full) loads with load_state_dict as it is.

    crosscheck CKPT REF   load CKPT (the C model's weights) and REF (written by tests/test_gpt.c:
                          the batch, the C model's mean loss and gradients), run forward and
                          backward, compare. Exit 0 if loss and gradients agree.
    bench [options]       train with AdamW on the text of fsdp.h (or --data) in one process, or in
                          --nproc P processes under DistributedDataParallel over gloo, one intra-op
                          thread each; print one line "torch-bench: ..." with tokens/s.

Needs the interpreter that has torch (/usr/bin/python3 on Debian: python3-torch). Without torch,
`crosscheck` prints a SKIP line and exits 0 (and `bench` exits 3). The safetensors files are read
here with struct and json (the safetensors package is not installed on our machines).
"""

import json
import math
import os
import struct
import sys
import time

# one BLAS / OpenMP thread per process; must be set before torch loads its libraries
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the cross-check reports a skip, the benchmark an error
    torch = None

# ------------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw little-endian data

ST_DTYPES = {"F32": ("float32", 4), "BF16": ("bfloat16", 2), "F16": ("float16", 2)}


def read_safetensors(path):
    """{name: float32 tensor} and the metadata dict of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        dtype, size = ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        assert end - begin == size * math.prod(shape), name
        raw = bytearray(data[begin:end])  # frombuffer wants a writable buffer
        t = torch.frombuffer(raw, dtype=getattr(torch, dtype)) if raw else torch.empty(0, dtype=getattr(torch, dtype))
        tensors[name] = t.reshape(shape).float()
    return tensors, metadata


# ------------------------------------------------------------------------------------------------
# the model

if torch is not None:

    class CausalSelfAttention(nn.Module):
        def __init__(self, C, NH):
            super().__init__()
            self.NH = NH
            self.c_attn = nn.Linear(C, 3 * C)  # query, key, value side by side
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, T, C = x.shape
            hs = C // self.NH
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, self.NH, hs).transpose(1, 2)  # (B, NH, T, hs)
            k = k.view(B, T, self.NH, hs).transpose(1, 2)
            v = v.view(B, T, self.NH, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, C):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, C, NH):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = CausalSelfAttention(C, NH)
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP(C)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, V, maxT, L, NH, C):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(maxT, C)
            self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            # GPT-2's initialisation, as gpt_model.h's sizes table
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                    nn.init.ones_(p)
                else:
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the LM head, tied to wte
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


# ------------------------------------------------------------------------------------------------
# cross-check against the C model

LOSS_TOLERANCE = 1e-5  # absolute, on a mean loss of about 5.5
GRAD_TOLERANCE = 1e-4  # relative, per tensor: ||g_c - g_torch|| / ||g_torch|| and max |g_c - g_torch| / max |g_torch|


def crosscheck(ckpt_path, ref_path):
    if torch is None:
        print("SKIP torch cross-check: %s has no torch (sudo apt-get install python3-torch)" % sys.executable)
        return 0
    torch.set_num_threads(1)
    weights, meta = read_safetensors(ckpt_path)
    ref, ref_meta = read_safetensors(ref_path)
    V, C = weights["wte.weight"].shape
    maxT = weights["wpe.weight"].shape[0]
    L = sum(1 for k in weights if k.endswith(".ln_1.weight"))
    NH = int(ref_meta["heads"])
    model = GPT(V, maxT, L, NH, C)
    params = {k: v for k, v in weights.items() if not (k.endswith(".exp_avg") or k.endswith(".exp_avg_sq"))}
    model.load_state_dict(params, strict=True)
    inputs = ref["inputs"].long()
    targets = ref["targets"].long()
    loss = model(inputs, targets)
    loss.backward()
    c_loss = float(ref["loss"][0])
    ok = True
    loss_err = abs(float(loss) - c_loss)
    print("model: %d layers, %d heads, %d channels, vocabulary %d, batch %s; loss C %.7f torch %.7f, |diff| %.2e (tolerance %g)"
          % (L, NH, C, V, tuple(inputs.shape), c_loss, float(loss), loss_err, LOSS_TOLERANCE))
    if not loss_err <= LOSS_TOLERANCE:
        print("FAIL: the loss differs")
        ok = False
    worst = (0.0, "")
    failures = []
    for name, p in model.named_parameters():
        g_c = ref["grad." + name]
        g_t = p.grad.double()
        diff = (g_c.double() - g_t)
        norm_err = float(diff.norm() / g_t.norm()) if float(g_t.norm()) > 0 else float(diff.norm())
        max_err = float(diff.abs().max() / g_t.abs().max()) if float(g_t.abs().max()) > 0 else float(diff.abs().max())
        err = max(norm_err, max_err)
        if err > worst[0]:
            worst = (err, name)
        if not err <= GRAD_TOLERANCE:
            failures.append("FAIL: gradient of %s: relative error %.3g in norm, %.3g in max (tolerance %g)"
                            % (name, norm_err, max_err, GRAD_TOLERANCE))
    print("gradients: %d tensors, largest relative error %.2e (%s; tolerance %g)%s"
          % (len(list(model.parameters())), worst[0], worst[1], GRAD_TOLERANCE,
             "; %d beyond it" % len(failures) if failures else ""))
    for line in failures:
        print(line)
    ok = ok and not failures
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------------
# benchmark

def data_batch(text, step, B, T, lo, hi):
    """gpt_model.h's data_batch: global sequence g = step*B + b reads window (g * stride) mod W."""
    W = (len(text) - 1) // T
    stride = max(1, int(0.618 * W))
    while math.gcd(stride, W) != 1:
        stride += 1
    rows = []
    for b in range(lo, hi):
        k = ((step * B + b) % W) * stride % W
        rows.append(text[k * T:k * T + T + 1])
    batch = torch.tensor(rows, dtype=torch.long)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def bench_rank(rank, args, text, port, results):
    torch.set_num_threads(1)
    P = args.nproc
    ddp = P > 1
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=P)
    torch.manual_seed(args.seed)
    model = GPT(256, args.seq_len, args.layers, args.heads, args.channels)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=args.foreach)
    B = args.batch // P
    times = []
    for step in range(args.warmup + args.steps):
        x, y = data_batch(text, step, args.batch, args.seq_len, rank * B, (rank + 1) * B)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    loss = loss.detach()
    if ddp:
        dist.all_reduce(loss)
        loss /= P
        dist.destroy_process_group()
    timed = sorted(times[args.warmup:])
    median = timed[len(timed) // 2] if len(timed) % 2 else 0.5 * (timed[len(timed) // 2 - 1] + timed[len(timed) // 2])
    results[rank] = (median, float(loss), peak_rss_bytes())


def peak_rss_bytes():
    """This process's own peak resident set (VmHWM), not ru_maxrss (which survives exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_worker(rank, args, text, port, shared):
    local = {}
    bench_rank(rank, args, text, port, local)
    shared[rank] = local[rank]


def bench(argv):
    import argparse
    p = argparse.ArgumentParser(prog="torch_gpt.py bench")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="global batch in sequences")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nproc", type=int, default=1, help="1: one process; P > 1: DDP over gloo")
    p.add_argument("--data", default=None, help="text (default fsdp.h next to this script's directory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--foreach", type=int, default=None, help="AdamW's foreach (default: PyTorch's default)")
    args = p.parse_args(argv)
    if torch is None:
        print("torch-bench: %s has no torch (sudo apt-get install python3-torch)" % sys.executable, file=sys.stderr)
        return 3
    if args.foreach is not None:
        args.foreach = bool(args.foreach)
    path = args.data or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fsdp.h")
    with open(path, "rb") as f:
        text = list(f.read())
    if args.batch % args.nproc:
        print("torch-bench: --batch %d is not divisible by --nproc %d" % (args.batch, args.nproc), file=sys.stderr)
        return 2
    if args.nproc == 1:
        results = {}
        bench_rank(0, args, text, 0, results)
    else:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(bench_worker, args=(args, text, port, results), nprocs=args.nproc, join=True)
        results = dict(results)
    ms = max(r[0] for r in results.values()) * 1e3  # the slowest rank
    tokens = args.batch * args.seq_len
    print("torch-bench: P=%d %s tokens/s %.1f ms/step %.2f loss %.4f peak_rss_mib %.1f torch %s threads %d" % (
        args.nproc, "ddp-gloo" if args.nproc > 1 else "eager", tokens / (ms * 1e-3), ms, results[0][1],
        max(r[2] for r in results.values()) / 1048576.0, torch.__version__, torch.get_num_threads()))
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "crosscheck" and len(sys.argv) == 4:
        return crosscheck(sys.argv[2], sys.argv[3])
    if len(sys.argv) >= 2 and sys.argv[1] == "bench":
        return bench(sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
