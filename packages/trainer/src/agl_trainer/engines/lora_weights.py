"""LoRA adapters in a running engine: load new weights from a folder (as `PolicyTrainer.save` or peft's
`save_pretrained` writes it) and drop adapters, without a restart.

This is how a policy trained in one process reaches an engine serving in another: the trainer saves the adapter,
then asks the engine (`POST /v1/load_lora_adapter`, the route and body vLLM uses for the same thing) to load it.
Loading under a name that is already served replaces that adapter's weights in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl_trainer.engines.embedded import BASE_MODEL, Engine

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


class AdapterError(ValueError):
    """A request about adapters that cannot be done; the message says why."""


def loaded_adapters(model: Any) -> set[str]:
    peft_config = getattr(model, "peft_config", None)
    return set(peft_config) if isinstance(peft_config, dict) else set()


def _check_folder(path: Path) -> None:
    missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not (path / name).is_file()]
    if missing:
        raise AdapterError(f"{path} is not a LoRA adapter folder: {', '.join(missing)} missing")


def load_adapter(engine: Engine, name: str, path: str | Path) -> bool:
    """Serve the adapter in `path` as model `name`. Returns True when it replaced an adapter of that name."""
    if not name or name == BASE_MODEL:
        raise AdapterError(f"adapter name {name!r} is reserved or empty")
    folder = Path(path)
    _check_folder(folder)
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    with engine.lock:  # no generation while weights change
        replaced = name in loaded_adapters(engine.model)
        if replaced:
            result = set_peft_model_state_dict(
                engine.model, load_file(str(folder / WEIGHTS_FILE), device=str(engine.device)), adapter_name=name
            )
            unexpected = getattr(result, "unexpected_keys", None)
            if unexpected:
                raise AdapterError(f"{folder} does not fit adapter {name!r}: unexpected weights {unexpected[:3]}")
        elif isinstance(engine.model, PeftModel):
            engine.model.load_adapter(str(folder), adapter_name=name)
        else:
            engine.model = PeftModel.from_pretrained(engine.model, str(folder), adapter_name=name)
        engine.model.eval()
        engine.weights_changed()
    return replaced


def unload_adapter(engine: Engine, name: str) -> None:
    with engine.lock:
        if name not in loaded_adapters(engine.model):
            raise AdapterError(f"no adapter named {name!r} is loaded")
        if len(loaded_adapters(engine.model)) == 1:
            raise AdapterError(f"{name!r} is the last adapter of the model; it cannot be removed while serving")
        engine.model.delete_adapter(name)
        if engine.default_adapter == name:
            engine.default_adapter = None
        engine.weights_changed()
