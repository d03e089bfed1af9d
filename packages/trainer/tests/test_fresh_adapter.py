"""The fresh fp32 LoRA adapter each verl rank loads (agl_trainer.verl.adapter): written for verl to build the model
from, then deleted (every rank of every run left one in the temp folder before)."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from agl_trainer.models import resolve_model
from agl_trainer.verl.adapter import fresh_adapter_folder


def test_the_folder_holds_peft_s_adapter_while_verl_builds_and_is_gone_after() -> None:
    targets = ["q_proj", "v_proj"]
    with fresh_adapter_folder(resolve_model("bundled"), rank=4, alpha=8, targets=targets, seed=3) as folder:
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == 4 and config["lora_alpha"] == 8 and sorted(config["target_modules"]) == targets
        state = load_file(str(folder / "adapter_model.safetensors"))
        assert state and all(str(t.dtype) == "torch.float32" for t in state.values())
        assert all(float(t.abs().max()) == 0.0 for name, t in state.items() if "lora_B" in name)
        assert any(float(t.abs().max()) > 0.0 for name, t in state.items() if "lora_A" in name)
        written = folder
    assert not written.exists()
