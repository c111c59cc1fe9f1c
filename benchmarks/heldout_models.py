"""Models no test names, trained as a user would: each on 1 device and on 2 (the layout the
search picks), 4 samples in 2 micro-batches, SGD, 2 steps, on local CPU workers. Per model:
whether the 2-device losses equal one device's (1e-4 relative; dropout and batch norm
included), and per rank the measured peak against the prediction (over: by 1 % and 16 KiB).

    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py            # ~60 models, ~25 min
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --models torchvision:squeezenet1_0
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --hf --tp 2   # 40 HF types, tp 2
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --hf-more     # 35 more HF types
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --hf-images   # 20 HF image models
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --timm-more   # 50 timm families
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --batch-size 8 --options '{"dp": 2}'
    PYTHONPATH=. .venv/bin/python benchmarks/heldout_models.py --memory-fraction 0.6

``--memory-fraction F`` gives the multi-device run a limit of F times one device's predicted
peak, so the search must split the model (or checkpoint, or offload) as a user short of memory
would have it; a rank whose measured peak passes that limit counts as over.

A given ``dp`` counts the micro-batches per copy (docs/models.md): the one-device run then
trains with ``dp`` times as many, the same groups of samples.

Prints one line per model and writes ``benchmarks/results/heldout_models.{json,md}``
(``heldout_models_hf_tp2.*`` and the like for ``--hf``, ``--hf-more``, ``--tp``, ``--devices``,
``--batch-size`` and ``--options``).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

# small images keep a model's step to seconds; the options are the models' own
MODELS = [f"timm:{m}" for m in (
    "efficientnet_b0:image_size=64", "mobilenetv3_small_050:image_size=64",
    "densenet121:image_size=64", "dla34:image_size=32",
    "vit_tiny_patch16_224:image_size=32,depth=2",
    "levit_128s:image_size=64", "poolformer_s12:image_size=32", "mobilevit_xxs:image_size=64",
    "rexnet_100:image_size=32", "ese_vovnet19b_dw:image_size=32", "cspresnet50:image_size=32",
    "dpn68:image_size=32", "skresnet18:image_size=32", "repvgg_a0:image_size=32",
    "hgnet_tiny:image_size=64", "efficientvit_b0:image_size=64", "edgenext_xx_small:image_size=64",
    "swin_tiny_patch4_window7_224:image_size=56,depths=(1,1,1,1)", "coat_lite_tiny:image_size=32",
    "inception_next_tiny:image_size=64", "mambaout_femto:image_size=64",
    "visformer_tiny:image_size=64", "gcvit_xxtiny:image_size=64",
    "resnetv2_50x1_bit:image_size=32", "botnet26t_256:image_size=64",
    "cs3darknet_s:image_size=32", "vgg11_bn:image_size=32", "xception41:image_size=64",
    "selecsls42b:image_size=32", "tresnet_m:image_size=64", "pit_ti_224:image_size=64",
    "twins_pcpvt_small:image_size=64", "focalnet_tiny_srf:image_size=64",
    "davit_tiny:image_size=64", "tnt_s_patch16_224:image_size=64", "resnet50d:image_size=32",
    "regnety_002:image_size=32", "convnextv2_atto:image_size=32", "fastvit_t8:image_size=64",
    "pvt_v2_b0:image_size=32", "nf_resnet26:image_size=32", "ghostnet_050:image_size=64",
    "resnest14d:image_size=64", "convnext_atto:image_size=64,drop_path_rate=0.1")] + [
    f"torchvision:{m}" for m in (
        "googlenet", "mnasnet0_5", "shufflenet_v2_x0_5", "squeezenet1_0", "regnet_y_400mf",
        "swin_t", "efficientnet_v2_s", "maxvit_t")] + [
    f"hf:{t}" for t in ("phi3", "bloom", "openai-gpt", "olmoe", "glm", "helium", "nemotron",
                        "squeezebert", "gemma3_text", "xlnet", "gpt2:dropout=0.1")]


# Hugging Face types the list above does not name (tiny sizes, random weights), for --hf
HF_TYPES = [f"hf:{t}" for t in (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "falcon", "gpt_neox",
    "gptj", "opt", "bert", "roberta", "distilbert", "electra", "albert", "deberta-v2", "t5",
    "bart", "mixtral", "qwen2_moe", "starcoder2", "stablelm", "codegen", "mbart", "gpt_bigcode",
    "mpt", "granite", "cohere", "olmo2", "persimmon", "biogpt", "ernie", "megatron-bert",
    "mobilebert", "rembert", "xglm", "ctrl", "bloom")]


# 35 more Hugging Face types, drawn at random (seed 7) from those that build tiny and no list
# above names, for --hf-more (hf:zamba, also drawn, takes 20 minutes a run here: left out)
HF_MORE_TYPES = [f"hf:{t}" for t in (
    "hunyuan_v1_moe", "esm", "led", "sarvam_mla", "big_bird", "camembert", "nystromformer",
    "data2vec-text", "jamba", "prophetnet", "bitnet", "mt5", "gemma3n", "bamba", "cpmant",
    "mamba", "longformer", "blt", "git", "cwm", "omniasr", "longt5", "blenderbot", "pegasus_x",
    "doge", "gemma4_text", "reformer", "recurrent_gemma", "xlm", "solar_open", "phimoe",
    "youtu", "yoso", "gemma4", "bert-generation")]


# one model of each timm family (module) the lists above leave out, the smallest by parameters
# (64-pixel images), for --timm-more; crossvit_tiny_240, deepseek_vit_412m, efficientformer_l1,
# inception_resnet_v2 and inception_v4, also drawn, refuse 64-pixel images themselves
TIMM_MORE = [f"timm:{m}:image_size=64" for m in (
    "beit_base_patch16_224", "cait_xxs24_224", "convit_tiny", "convmixer_768_32",
    "cpubone_nano", "csatv2", "cspnext_tiny", "deit_tiny_patch16_224", "efficientformerv2_s0",
    "efficientvim_m1", "efficientvit_m0", "vit_tiny_patch16_dinov3_qkvb", "fasternet_t0",
    "gemma4_vit_167m", "hardcorenas_b", "hiera_tiny_224", "sam2_hiera_tiny",
    "hrnet_w18_small", "iformer_t", "lcnetv2_small", "lowformer_b0", "test_coatnet",
    "gmlp_ti16_224", "mobilenetv5_base", "mvitv2_tiny", "naflexvit_base_patch16_parfac_gap",
    "nasnetalarge", "nest_tiny", "nextvit_small", "pnasnet5large", "qwen3_vit_88m",
    "rdnet_tiny", "repghostnet_050", "repvit_m1", "res2next50", "legacy_seresnet18",
    "sequencer2d_s", "shvit_s1", "starnet_s050", "swiftformer_xs", "swinv2_tiny_window8_256",
    "swinv2_cr_tiny_224", "tiny_vit_5m_224", "vit_tiny_r_s16_p8_224", "test_vit_relpos",
    "samvit_base_patch16_224", "vitamin_small_224", "volo_d1_224", "legacy_xception",
    "xcit_nano_12_p8_224")]


# Hugging Face image classifiers (32-pixel images; Swin-style windows: 128), for --hf-images
HF_IMAGE_TYPES = [f"hf:{t}" for t in (
    "vit", "deit", "beit", "dinov2", "convnext", "convnextv2", "swin", "swinv2", "resnet",
    "regnet", "efficientnet", "mobilenet_v2", "mobilevit", "levit", "poolformer", "segformer",
    "cvt", "pvt", "bit", "focalnet")]


def one(model: str, run_dir: str, devices: int = 2, options: dict | None = None,
        batch_size: int = 4, memory_fraction: float | None = None) -> dict:
    import numpy as np

    import outcore

    options = options or {}
    kw = dict(batch_size=batch_size, steps=2, optimizer="sgd", costs="estimate:cpu",
              timeline=False, run_dir=run_dir, seed=0, microbatches=2, progress=False)
    # a given --dp counts the micro-batches per copy (docs/models.md): one device's equal run
    # has as many in all
    copies = int(options.get("dp", 1))
    r1 = outcore.train(model, 1, **{**kw, "microbatches": kw["microbatches"] * copies})
    limit = None
    if memory_fraction:
        limit = int(memory_fraction * max(r1.per_rank("peak_bytes")))
        options = {**options, "memory": limit}
    r2 = outcore.train(model, devices, **{**kw, **options})
    ranks = []
    for r in (r1, r2):
        for meas, pred in zip(r.peak_bytes or [], r.per_rank("peak_bytes")):
            ranks.append((float(meas) / 2**20, float(pred) / 2**20))
    over = [m for m, p in ranks if m > p * 1.01 and (m - p) * 2**20 > 16384]
    if limit:
        over += [m for m in (r2.peak_bytes or []) if m > limit]
    lay = r2.plan.layout
    return {"equal": bool(np.allclose(r1.losses, r2.losses, rtol=1e-4, atol=1e-6)),
            "losses_1": list(r1.losses), "losses_2": list(r2.losses),
            "layout": f"{lay.mode} r{lay.replicas} dp{lay.dp}"
            + (f" tp{lay.tp}" if lay.tp > 1 else "") + (f" sp{lay.sp}" if lay.sp > 1 else "")
            + (f" {','.join(sorted(set(r2.plan.policies.policies)))}" if r2.plan.policies else "")
            + (f" M{r2.plan.microbatches}" if limit else ""),
            "ranks": ranks,
            "worst": max(m / p for m, p in ranks if p), "over": len(over)}


def main() -> None:
    from outcore.api import fixed_hash_seed

    fixed_hash_seed()  # Gemma 4 iterates a set of strings: every process traces alike
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", help="model specs (default: the list above)")
    ap.add_argument("--hf", action="store_true", help="the Hugging Face types of HF_TYPES")
    ap.add_argument("--hf-more", action="store_true",
                    help="the 35 more Hugging Face types of HF_MORE_TYPES")
    ap.add_argument("--hf-images", action="store_true",
                    help="the Hugging Face image classifiers of HF_IMAGE_TYPES")
    ap.add_argument("--timm-more", action="store_true",
                    help="one model of each timm family the default list leaves out (TIMM_MORE)")
    ap.add_argument("--tp", type=int, help="train the multi-device run with --tp N")
    ap.add_argument("--devices", type=int, default=2, help="devices of the second run")
    ap.add_argument("--options", default="{}",
                    help="JSON: more outcore.train options of the second run ({\"dp\": 2})")
    ap.add_argument("--batch-size", type=int, default=4, help="global batch (default 4)")
    ap.add_argument("--memory-fraction", type=float,
                    help="limit the multi-device run to F x one device's predicted peak")
    ap.add_argument("--run-dir", default="/tmp/outcore_heldout")
    args = ap.parse_args()
    options = {**json.loads(args.options), **({"tp": args.tp} if args.tp else {})}
    name = "heldout_models" + ("_hf" if args.hf else "") + ("_hf_more" if args.hf_more else "") + \
        ("_hf_images" if args.hf_images else "") + ("_timm_more" if args.timm_more else "") + \
        (f"_d{args.devices}" if args.devices != 2 else "") + \
        (f"_b{args.batch_size}" if args.batch_size != 4 else "") + \
        "".join(f"_{k}{v}".replace(" ", "") for k, v in sorted(options.items())) + \
        (f"_mem{args.memory_fraction:g}" if args.memory_fraction else "")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rows = []
    chosen = HF_TYPES if args.hf else HF_MORE_TYPES if args.hf_more else \
        HF_IMAGE_TYPES if args.hf_images else TIMM_MORE if args.timm_more else MODELS
    for m in args.models or chosen:
        t0 = time.perf_counter()
        try:
            row = {"model": m, **one(m, args.run_dir, args.devices, options, args.batch_size,
                                       args.memory_fraction)}
            text = (f"{'equal' if row['equal'] else 'DIFFERENT'} losses on {row['layout']}; "
                    f"worst measured/predicted {row['worst']:.3f}"
                    + (f", {row['over']} ranks OVER" if row["over"] else ""))
        except Exception as e:  # noqa: BLE001 - every failure is a row of the table
            row = {"model": m, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            text = row["error"]
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(f"{m}: {text} ({row['seconds']} s)", flush=True)
    ran = [r for r in rows if "error" not in r]
    summary = (f"{sum(r['equal'] for r in ran)} of {len(rows)} models equal on "
               f"{args.devices} devices{' ' + json.dumps(options) if options else ''}; "
               f"{sum(r['over'] == 0 for r in ran)} within their predicted peak on every rank; "
               f"{len(rows) - len(ran)} did not run")
    print("\n" + summary)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"summary": summary, "rows": rows},
                                                            indent=1))
    lines = [summary, "", f"| model | {args.devices}-device layout | losses | "
             "worst measured / predicted |",
             "| --- | --- | --- | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | {r['error']} | - |")
        else:
            lines.append(f"| {r['model']} | {r['layout']} | "
                         f"{'equal' if r['equal'] else '**different**'} | {r['worst']:.3f} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
