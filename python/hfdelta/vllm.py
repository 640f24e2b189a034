"""hfdelta as a vLLM weight-transfer backend: engines that pull versions from the publication root.

Start the engine on its host-local checkpoint LOCAL (set up once with ``hfdelta.init``) with::

    VLLM_SERVER_DEV_MODE=1 vllm serve LOCAL --worker-extension-cls hfdelta.vllm.WorkerExtension \\
        --weight-transfer-config '{"backend": "hfdelta"}'

``--worker-extension-cls`` imports this module in every worker process, which registers the backend
``hfdelta`` with vLLM's ``WeightTransferEngineFactory``. vLLM's RL routes then drive it
(``hfdelta.engines`` does, from the trainer):

- ``POST /init_weight_transfer_engine`` ``{"init_info": {"root": ROOT}}``: the publication root as this
  host sees it; ``"local"`` where the engine does not serve LOCAL itself (then the first update loads
  from LOCAL), ``"lock_timeout"`` (seconds, default 300) and ``"threads"`` optional;
- ``POST /collective_rpc`` ``{"method": "hfdelta_stage", "kwargs": {"version": "3"}}``: the pull into
  LOCAL, in a thread of each worker, while the engine goes on serving; ``hfdelta_state`` tells how it
  goes (``stage.state``: running, done, failed, or deferred where the engine maps LOCAL's files);
- ``/pause``, ``/start_weight_update``, ``POST /update_weights`` ``{"update_info": {"version": 3}}``
  (under a shared flock on LOCAL, the check that LOCAL holds version 3, pulling it first only where no
  stage did; then vLLM's checkpoint-format reload from LOCAL), ``/finish_weight_update``
  ``{"weight_version": "000003"}`` (what ``/weight_info`` then reports), ``/reset_prefix_cache``,
  ``/resume``.

Every worker of the engine pulls into its own host's LOCAL: workers on one host take LOCAL's lock in
turn, so the first pulls and the others find it done; an engine across hosts pulls on each. The lock
is delta-apply's, so a systemd puller on the same host can run too. Errors reach the HTTP caller as
the route's error message, LOCAL left at a version it holds in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

# vLLM and torch are not dependencies of the package: this module is imported only where vLLM runs.
# The ignores let mypy check the package where they are not installed ("unused-ignore" where they are).
import torch  # type: ignore[import-not-found,unused-ignore]
from vllm.distributed.weight_transfer.base import (  # type: ignore[import-not-found,unused-ignore]
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (  # type: ignore[import-not-found,unused-ignore]
    WeightTransferEngineFactory,
)
from vllm.model_executor.model_loader.reload.inplace import (  # type: ignore[import-not-found,unused-ignore]
    reload_weights,
)

from ._receiver import Receiver

__all__ = ["BACKEND", "HfdeltaInitInfo", "HfdeltaUpdateInfo", "HfdeltaWeightTransferEngine", "WorkerExtension",
           "register"]

BACKEND = "hfdelta"


@dataclass
class HfdeltaInitInfo(WeightTransferInitInfo):  # type: ignore[misc,unused-ignore]
    """``init_info`` of ``/init_weight_transfer_engine``."""
    root: str
    local: Optional[str] = None
    lock_timeout: Optional[float] = 300.0
    threads: int = 0


@dataclass
class HfdeltaUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc,unused-ignore]
    """``update_info`` of ``/update_weights``: the version; ``owner``: the caller's claim token (hfdelta.engines)."""
    version: Union[int, str]
    owner: Optional[str] = None


_EngineBase = WeightTransferEngine[HfdeltaInitInfo, HfdeltaUpdateInfo]


class HfdeltaWeightTransferEngine(_EngineBase):  # type: ignore[misc,valid-type,unused-ignore]
    """One per worker: a Receiver, and vLLM's own in-place reload from LOCAL in checkpoint format."""

    init_info_cls = HfdeltaInitInfo
    update_info_cls = HfdeltaUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver = Receiver(served=str(vllm_config.model_config.model))

    def init_transfer_engine(self, init_info: HfdeltaInitInfo) -> None:
        self.receiver.init(init_info.root, init_info.local, lock_timeout=init_info.lock_timeout,
                           threads=init_info.threads)

    def start_weight_update(self) -> None:
        """Nothing: reload_weights does the layerwise set-up and finish itself."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # the base class syncs unconditionally, which a CPU build lacks
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: HfdeltaUpdateInfo) -> None:
        self.receiver.update(update_info.version, self._reload, owner=update_info.owner)

    def _reload(self, local: str) -> None:
        # What the worker's reload_weights does (vLLM's model runner), from LOCAL in checkpoint format:
        # model_config.model becomes LOCAL where the engine was started elsewhere.
        reload_weights(self.vllm_config, self.model, weights_iterator=None, weights_path=local,
                       is_checkpoint_format=True)

    def finish_weight_update(self) -> None:
        """Nothing: the update loaded every weight (the worker resets its LoRA state after this)."""

    def shutdown(self) -> None:
        """Nothing to release: no connection to the trainer."""


class WorkerExtension:
    """``--worker-extension-cls hfdelta.vllm.WorkerExtension``: importing it registers the backend, and
    these methods are callable through ``POST /collective_rpc`` (every worker answers)."""

    def _hfdelta_receiver(self) -> Receiver:
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, HfdeltaWeightTransferEngine):
            raise RuntimeError("hfdelta: this engine's weight transfer backend is not hfdelta: start it with "
                               "--weight-transfer-config '{\"backend\": \"hfdelta\"}'")
        return engine.receiver

    def hfdelta_stage(self, version: Union[int, str], owner: Optional[str] = None) -> dict[str, Any]:
        """Starts the pull of ``version`` into LOCAL and returns at once (the engine keeps serving)."""
        return self._hfdelta_receiver().stage(version, owner=owner)

    def hfdelta_state(self, owner: Optional[str] = None) -> dict[str, Any]:
        """This worker's staging, claim, LOCAL version, last update's timings and LOCAL's files it maps."""
        return self._hfdelta_receiver().state(owner=owner)

    def hfdelta_release(self, owner: str) -> dict[str, Any]:
        """Ends ``owner``'s claim on this engine."""
        return self._hfdelta_receiver().release(owner)


def register() -> None:
    """Registers the backend ``hfdelta`` with vLLM (done when this module is imported; idempotent)."""
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, HfdeltaWeightTransferEngine)
    except ValueError:  # registered already (the module imported again)
        pass


register()
