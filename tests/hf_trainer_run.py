"""Run `transformers.Trainer` from an exported plan folder, as a user's own Hugging Face script would: the
arguments from training_arguments.json (parsed by HfArgumentParser), the model of plan.json with its
model_init_kwargs, synthetic batches of the model's shapes. Under torchrun for more than one rank.

    python tests/hf_trainer_run.py PLAN_DIR OUT_DIR STEPS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from pretrain_planner.trainer.models import build_model
from pretrain_planner.trainer.tasks import synthetic_batch
from transformers import HfArgumentParser, Trainer, TrainingArguments


def main(plan_dir: str, out_dir: str, steps: int) -> None:
    plan = json.loads((Path(plan_dir) / "plan.json").read_text())
    args = json.loads((Path(plan_dir) / "training_arguments.json").read_text())
    args.update(max_steps=steps, output_dir=out_dir, save_strategy="no", logging_steps=1, dataloader_num_workers=0)
    (training_args,) = HfArgumentParser(TrainingArguments).parse_dict(args)
    if training_args.deepspeed:  # ZeRO-3 partitions the model as it is built: DeepSpeed's comm must exist first
        import deepspeed

        deepspeed.init_distributed()
    torch.manual_seed(0)
    net, _ = build_model(plan["model"], plan["model_init_kwargs"].get("attn_implementation"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world * steps
    gen = torch.Generator().manual_seed(0)
    batch = synthetic_batch(plan["model"], n, gen)
    rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
    trainer = Trainer(model=net, args=training_args, train_dataset=rows)
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        Path(out_dir, "hf_result.json").write_text(json.dumps({"steps": trainer.state.global_step, "losses": losses}))
    if torch.distributed.is_initialized():  # every rank has finished training before any leaves
        torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    # Leave without the interpreter's teardown: with DeepSpeed's CPU communication op loaded, tearing down
    # (destroying the gloo group, then the interpreter's finalisation) aborted a rank once in CI with "terminate
    # called without an active exception", after training and the result were done - not what this test checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
