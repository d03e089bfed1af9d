"""The policy's new weights, published to an engine in another process (`agl engine`, a vLLM server, started by agl
or by someone else): LoRA adapters loaded under a new name per version (`RemoteAdapterEngine`) or, vLLM only, the
full weights reloaded in place (`RemoteWeightsEngine`). Both are `agl_trainer.backends.InferenceBackend`s and ask
every server of a fleet at once (`agl_trainer.engines.fan_out`).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agl_trainer.backends import EngineError
from agl_trainer.engines.fan_out import each_server, engine_urls, root_of
from agl_trainer.policy.trainer import PolicyTrainer


def _served_models(http: httpx.Client, base_url: str) -> list[dict[str, Any]]:
    try:
        resp = http.get(f"{base_url}/models")
    except httpx.HTTPError as exc:
        raise EngineError(f"cannot reach the engine at {base_url}: {exc}") from exc
    if resp.status_code != 200:
        raise EngineError(f"{base_url}/models answered {resp.status_code}: {resp.text[:300]}")
    data = resp.json().get("data") or []
    return [m for m in data if isinstance(m, dict)]


class RemoteAdapterEngine:
    """An inference backend in another process (`agl engine`, or a vLLM server started with LoRA support and
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) that serves the same base model: after each update the policy's
    adapters are saved under `folder/v<N>` and loaded there through `POST /v1/load_lora_adapter`, each under a
    name of its own, `<adapter>@v<N>` (`served_name`); the training loop then tells the proxy to route to them.
    The version before the previous one is unloaded and its folder deleted.

    Why a new name per version rather than one name reloaded with `"load_inplace": true`: vLLM 0.32 keeps that
    flag on the adapter it serves and re-reads the adapter from disk at every engine step from then on (measured
    on the bundled model: 98 loads of ~5 ms for two requests of 48 tokens; a large model's adapter costs far
    more), and its engine dies if the folder has gone. A new name is loaded once, cannot hit prefix-cache blocks
    computed with older weights (vLLM keys them by adapter name and path), and needs no slot beyond
    `--max-loras` = 2 × adapters.

    The folder must be readable by the serving process (same machine or a shared filesystem)."""

    # the previous version's adapter serves the calls routed to it while the next one loads: rollouts may run
    # through an update and its publication (agl_trainer.run.loop holds no call for it)
    serves_previous_version_while_loading = True

    def __init__(
        self,
        base_url: str,
        policy: PolicyTrainer,
        folder: str | Path,
        timeout_s: float = 300.0,
        server: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self.folder = Path(folder)
        self.server = server  # a `VLLMServer` agl started: checked before each publication
        self.headers = dict(headers or {})  # what requests to its servers carry: their key
        self._http = httpx.Client(timeout=timeout_s, headers=self.headers)
        # names left on a long-lived engine by an earlier run are never reused (on any of its servers)
        served = each_server(self._urls(), lambda url: _served_models(self._http, url), server)
        taken = [re.fullmatch(r"(.+)@v(\d+)", str(m.get("id", ""))) for models in served for m in models]
        ours = set(self.adapter_names())
        self.version = max([int(m.group(2)) for m in taken if m and m.group(1) in ours], default=0)
        self._first_version = self.version + 1

    def adapter_names(self) -> list[str]:
        """The policy's adapters: one per agent with per-agent policies, else the single adapter `default`."""
        return sorted(set(self.policy.agent_adapters.values())) or ["default"]

    def served_name(self, adapter: str) -> str:
        """The model name that serves `adapter` now (the base model and unknown names are served as they are)."""
        return f"{adapter}@v{self.version}" if adapter in self.adapter_names() and self.version else adapter

    def weights_changed(self) -> None:
        self.stage()
        self.serve()

    def stage(self) -> None:
        """Save the policy's adapters as the next version's folders (the trainer must hold its weights)."""
        if self.server is not None:
            self.server.check_alive()
        self.version += 1
        # the adapters alone: a full checkpoint (verl's shards and optimizer on every rank) per publication filled
        # the workers' disks, and the engine reads only the adapters
        self.policy.publish_adapters(self.folder / f"v{self.version}")

    def serve(self) -> None:
        """Load the staged version into the engine under its new names, and drop the one before the last."""
        target = self.folder / f"v{self.version}"
        for adapter in self.adapter_names():
            source = self.policy.adapter_folder(target, adapter)
            self._post(
                "load_lora_adapter", {"lora_name": self.served_name(adapter), "lora_path": str(source.resolve())}
            )
        old = self.version - 2
        if old >= self._first_version:
            for adapter in self.adapter_names():
                self._post("unload_lora_adapter", {"lora_name": f"{adapter}@v{old}"})
            shutil.rmtree(self.folder / f"v{old}", ignore_errors=True)  # only read when loaded: safe to delete now

    def _urls(self) -> list[str]:
        """Every server of the engine (one per node on a cluster: agl_trainer.engines.fleet)."""
        return engine_urls(self.base_url, self.server)

    def _post(self, route: str, body: dict[str, Any]) -> None:
        each_server(self._urls(), lambda url: self._post_to(url, route, body), self.server)

    def _post_to(self, base_url: str, route: str, body: dict[str, Any]) -> None:
        try:
            resp = self._http.post(f"{base_url}/{route}", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{base_url}/{route} failed for {body['lora_name']!r}: {exc}") from exc
        if resp.status_code != 200:
            raise EngineError(
                f"{base_url}/{route} refused {body['lora_name']!r} (HTTP {resp.status_code}): {resp.text[:500]}"
            )

    def close(self) -> None:
        self._http.close()


class RemoteWeightsEngine:
    """Full fine-tuning with a vLLM server: after each update the whole model is saved (safetensors, by
    `save_weights`) under `folder/v<N>`, vLLM's workers reload it in place (`POST /collective_rpc` with `reload_weights`, then
    `POST /reset_prefix_cache`: the reload keeps KV blocks computed with the old weights, which measurably served
    stale log-probs, 0.25 per token off, until the reset), and the previous copy is deleted. Both routes exist
    only when the server runs with `VLLM_SERVER_DEV_MODE=1` (`agl train --engine vllm` sets it)."""

    def __init__(
        self,
        base_url: str,
        save_weights: Callable[[Path], object],
        folder: str | Path,
        timeout_s: float = 600.0,
        server: Any = None,
        verify: Callable[[], object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = root_of(self.base_url)
        # writes the trained weights as a model folder: the model agl's trainer updates in this process, or verl's
        # actor's, gathered on its rank 0 (never a copy that the update did not touch)
        self.save_weights = save_weights
        # run after every reload: the served log-probs must be the trainer's (engine_check), or the run stops
        self.verify = verify
        self.folder = Path(folder)
        self.server = server
        self.version = 0
        self.loaded_version = 0  # the version vLLM's weights hold
        self.headers = dict(headers or {})  # what requests to its servers carry: their key
        self._http = httpx.Client(timeout=timeout_s, headers=self.headers)
        roots = [m for m in _served_models(self._http, self.base_url) if m.get("parent") is None]
        if not roots:
            raise EngineError(f"{self.base_url}/models lists no base model")
        self.base_name = str(roots[0]["id"])

    def served_name(self, adapter: str) -> str:
        return self.base_name

    def weights_changed(self) -> None:
        self.stage()
        self.serve()

    def stage(self) -> None:
        """Save the trained weights as the next version's model folder (the trainer must hold its weights)."""
        if self.server is not None:
            self.server.check_alive()
        self.version += 1
        self.save_weights(self.folder / f"v{self.version}")

    def reload(self) -> None:
        """vLLM's workers load the staged folder into their weights (`reload_weights`). Colocated, after a level-2
        sleep, this runs between waking the weights and the KV cache (`Colocation.restore`); `serve` then skips it."""
        target = self.folder / f"v{self.version}"
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(target.resolve())}}
        each_server(self._urls(), lambda url: self._reload_one(root_of(url), rpc), self.server)
        self.loaded_version = self.version

    def _urls(self) -> list[str]:
        return engine_urls(self.base_url, self.server)

    def _reload_one(self, root: str, rpc: dict[str, Any]) -> None:
        try:
            resp = self._http.post(f"{root}/collective_rpc", json=rpc)
        except httpx.HTTPError as exc:
            raise EngineError(f"{root}/collective_rpc reload_weights failed: {exc}") from exc
        if resp.status_code == 404:
            raise EngineError(
                f"{root} has no /collective_rpc, so it cannot take full weights: full fine-tuning with a remote "
                "engine needs vLLM started with VLLM_SERVER_DEV_MODE=1 (`agl train --engine vllm` does so); agl's own "
                "engine takes LoRA adapters only: train a LoRA policy (no --full-finetune) or use the embedded engine"
            )
        if resp.status_code != 200:
            raise EngineError(
                f"{root}/collective_rpc reload_weights failed (HTTP {resp.status_code}): {resp.text[:500]}"
            )

    def serve(self) -> None:
        """Reload the engine's weights from the staged folder (unless done already), reset its prefix cache, check
        what it serves."""
        if self.loaded_version != self.version:
            self.reload()
        self._reset_prefix_cache()
        shutil.rmtree(self.folder / f"v{self.version - 1}", ignore_errors=True)
        if self.verify is not None:
            self.verify()

    def _reset_prefix_cache(self) -> None:
        each_server(self._urls(), lambda url: self._reset_one(root_of(url)), self.server)

    def _reset_one(self, root: str, attempts: int = 50) -> None:
        for _ in range(attempts):  # refused while requests hold blocks: they finish within moments here
            try:
                resp = self._http.post(f"{root}/reset_prefix_cache")
            except httpx.HTTPError as exc:
                raise EngineError(f"{root}/reset_prefix_cache failed: {exc}") from exc
            if resp.status_code != 200:
                raise EngineError(f"{root}/reset_prefix_cache failed (HTTP {resp.status_code}): {resp.text[:300]}")
            if resp.json().get("success", True):
                return
            time.sleep(0.2)
        raise EngineError(f"{root} kept refusing to reset its prefix cache: requests are still running")

    def close(self) -> None:
        self._http.close()
