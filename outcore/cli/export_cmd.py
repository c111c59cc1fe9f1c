"""``outcore export``: a run's weights out of its checkpoint."""

from __future__ import annotations

import argparse

from outcore import api
from outcore.cli.common import console
from outcore.units import format_bytes

DESCRIPTION = """Write the weights of a training run from its checkpoint to one .safetensors
file, named as the model's state_dict() (parameters and buffers; no optimizer state), which
plain PyTorch loads with safetensors.torch.load_file and model.load_state_dict. CHECKPOINT is a
--checkpoint-dir of outcore train (its newest usable checkpoint) or one of its step_<N>
folders; it is verified first (a checkpoint is code). -o names a .safetensors file, or a folder:
then model.safetensors and, for a Hugging Face model, its config.json, so
AutoModelFor...from_pretrained(folder) loads it (and outcore train hf:FOLDER trains on)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run's weights from its checkpoint",
                       description=DESCRIPTION)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a --checkpoint-dir, or one of its step_<N> folders")
    p.add_argument("-o", "--out", required=True, metavar="FILE.safetensors|FOLDER",
                   help="where to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    done = api.export(args.checkpoint, args.out)
    console.print(f"step {done['step']}: {done['tensors']} tensors, "
                  f"{format_bytes(done['bytes'])} -> {done['file']}"
                  + (f" (and {done['config']})" if done.get("config") else ""))
    return 0
