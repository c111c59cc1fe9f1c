"""Which Hugging Face model types ``hf:<type>`` builds with outcore's tiny sizes: every causal-,
masked- and seq2seq-LM type the installed ``transformers`` lists, resolved and built once
(random init, offline) in a worker process, each under a time cap (a type whose tiny sizes do
not take builds its full-size default, which may take minutes or more memory than the machine
has: the worker is then replaced and the type counted as not built).

    PYTHONPATH=. .venv/bin/python benchmarks/hf_types.py                  # every type (~15 min)
    PYTHONPATH=. .venv/bin/python benchmarks/hf_types.py --types gpt2 helium xlnet

Prints one line per type (built: its parameter count; else the error's last line) and writes
``benchmarks/results/hf_types.{json,md}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing as mp
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def all_types() -> list[str]:
    from transformers.models.auto import modeling_auto as ma
    return sorted(set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
                  | set(ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
                  | set(ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES))


def build_one(model_type: str) -> dict:
    """In a worker: resolve and build ``hf:<model_type>``; its parameter count or its error."""
    from outcore.zoo.resolve import resolve_model

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        net = resolve_model(f"hf:{model_type}", batch_size=2).build()
        out = {"built": True, "parameters": sum(p.numel() for p in net.parameters())}
        del net
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        text = str(e).strip().splitlines()
        out = {"built": False, "error": f"{type(e).__name__}: {text[-1][:200] if text else ''}"}
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="*", help="model types (default: every LM type listed)")
    ap.add_argument("--cap", type=int, default=40, help="seconds per type (default 40)")
    args = ap.parse_args()
    types = args.types or all_types()
    rows = []
    pool = mp.get_context("spawn").Pool(1)
    for t in types:
        t0 = time.perf_counter()
        try:
            out = pool.apply_async(build_one, (t,)).get(timeout=args.cap)
        except mp.TimeoutError:  # a build past the cap, or a worker the system killed
            pool.terminate()
            pool = mp.get_context("spawn").Pool(1)
            out = {"built": False, "error": f"not built within {args.cap} s"}
        row = {"type": t, **out, "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        what = f"{row['parameters']:,} parameters" if row["built"] else row["error"]
        print(f"{t}: {what} ({row['seconds']:.1f} s)", flush=True)
    pool.terminate()
    built = sum(r["built"] for r in rows)
    print(f"\n{built} of {len(rows)} types built")
    import transformers
    RESULTS.mkdir(exist_ok=True)
    doc = {"transformers": transformers.__version__, "built": built, "types": len(rows),
           "rows": rows}
    (RESULTS / "hf_types.json").write_text(json.dumps(doc, indent=1))
    lines = [f"{built} of {len(rows)} types built (transformers {transformers.__version__})", "",
             "| type | not built: why |", "| --- | --- |"]
    lines += [f"| {r['type']} | {r['error']} |" for r in rows if not r["built"]]
    (RESULTS / "hf_types.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
