"""The merger's command line and settings, with upstream verl's argument names and defaults."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """`merge` writes a Hugging Face folder; `test` compares the merged weights with a reference folder."""
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger",
                                     description="Merge verl checkpoint shards into a Hugging Face model folder.")
    operations = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"],
                        help="the trainer that wrote the checkpoint (this verl writes fsdp)")
    common.add_argument("--local_dir", required=True,
                        help="a checkpoint's role folder, e.g. checkpoints/.../global_step_10/actor")
    common.add_argument("--tie-word-embedding", action="store_true",
                        help="accepted for upstream compatibility (megatron only); fsdp reads it from config.json")
    common.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code")
    common.add_argument("--is-value-model", action="store_true",
                        help="write a one-label token classifier (a critic); fsdp also detects it by its score head")
    common.add_argument("--use_cpu_initialization", action="store_true",
                        help="accepted for upstream compatibility; the fsdp merge always runs on the CPU")
    merge = operations.add_parser("merge", parents=[common], help="merge the shards and save the model")
    merge.add_argument("--target_dir", default="tmp", help="where to write the Hugging Face folder")
    merge.add_argument("--hf_upload_path", default=None, help="also upload the folder to this hub repository id")
    merge.add_argument("--private", action="store_true", help="make the uploaded repository private")
    test = operations.add_parser("test", parents=[common], help="compare merged weights with a reference folder")
    test.add_argument("--test_hf_dir", required=True, help="the reference Hugging Face folder")
    return parser.parse_args(argv)


@dataclass
class ModelMergerConfig:
    """What one merge (or test) run does; `hf_model_config_path` is where config and tokenizer are read."""

    operation: str
    backend: str
    target_dir: str | None = "tmp"
    hf_upload_path: str | None = None
    private: bool = False
    test_hf_dir: str | None = None
    tie_word_embedding: bool = False
    trust_remote_code: bool = False
    is_value_model: bool = False
    local_dir: str | None = None
    hf_model_config_path: str | None = None
    hf_upload: bool = field(init=False)
    use_cpu_initialization: bool = False

    def __post_init__(self):
        self.hf_upload = self.operation == "merge" and bool(self.hf_upload_path)
        if self.hf_model_config_path is None and self.local_dir is not None:
            self.hf_model_config_path = os.path.join(self.local_dir, "huggingface")


def generate_config_from_args(args: argparse.Namespace) -> ModelMergerConfig:
    merge = args.operation == "merge"
    return ModelMergerConfig(
        operation=args.operation,
        backend=args.backend,
        target_dir=args.target_dir if merge else None,
        hf_upload_path=args.hf_upload_path if merge else None,
        private=args.private if merge else False,
        test_hf_dir=None if merge else args.test_hf_dir,
        tie_word_embedding=args.tie_word_embedding,
        trust_remote_code=args.trust_remote_code,
        is_value_model=args.is_value_model,
        local_dir=args.local_dir,
        use_cpu_initialization=args.use_cpu_initialization,
    )
