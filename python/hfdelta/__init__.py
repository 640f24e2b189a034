"""hfdelta: byte-level weight deltas between successive Hugging Face safetensors checkpoints.

The CLIs' forms as functions, built from the same library (the ``hfdelta._core``
extension module):

==========================================  ============================================
function                                    command line
==========================================  ============================================
``diff(base, new, out)``                    ``delta-diff BASE NEW OUT`` (OUT may be ROOT)
``publish_full(new, root, base=None)``      ``delta-diff --full [BASE] NEW ROOT``
``squash(first, last, out)``                ``delta-diff --squash FIRST LAST OUT``
``inspect(delta)``                          ``delta-diff --inspect DELTA``
``prune(root, keep_from=None)``             ``delta-diff --prune ROOT [--keep-from N]``
``withdraw(version_dir)``                   ``delta-diff --withdraw ROOT/weight_vNNNNNN``
``init(src, local, version=0)``             ``delta-apply --init SRC LOCAL``
``apply(delta, local)``                     ``delta-apply DELTA LOCAL``
``pull(root, local, target=None)``          ``delta-apply --root ROOT LOCAL``
``status(local)``                           ``delta-apply --status LOCAL``
``verify(local)``                           ``delta-apply --verify LOCAL``
``recover(local)``                          ``delta-apply --recover LOCAL``
==========================================  ============================================

Keyword arguments mirror the CLI options (``encoding``, ``level``, ``delta_version``,
``base_version``, ``threads``, ``sync`` for ``--no-sync``, ``lock_timeout``, ``force``,
``require_marker``, ``keep_from``, ``dry_run``); paths are str or os.PathLike. Each returns a
frozen dataclass (hfdelta.results) whose fields are the keys of the CLI's ``--json`` object;
``to_dict()`` gives the object. Errors raise hfdelta.errors.HfdeltaError, one subclass per exit
code. ``status`` and ``verify`` report every state of LOCAL in their result instead.

Callbacks: ``then(version)`` (init, apply, pull) runs while LOCAL is still locked, as
``--then``; if it raises, the operation still succeeded and ThenFailed (exit 9) is raised with
``.result``. ``pre_read()`` (pull) runs before ROOT is read, as ``--pre-read``; if it raises,
PreReadFailed (exit 14), LOCAL untouched. ``progress(phase, done, total)`` is called from a
helper thread about every 0.2 s while the call runs (and once at its end), whenever a phase begun
by the call has moved; a progress callback that raises is not called again, its exception goes to
``sys.unraisablehook`` (printed by default) and the operation goes on. Progress is counted
process-wide: two calls running at once in one process see each other's phases.

Every function releases the GIL while the library works; the callbacks take it back.

Publishing from the trainer's memory: ``Publisher(root, mirror)`` diffs tensors given one at
a time (numpy arrays, torch CPU tensors, anything speaking DLPack or the buffer protocol)
against ``mirror``, a LOCAL holding the last published version, publishes version newest + 1
into ``root`` (the delta delta-diff would write) and advances the mirror (hfdelta.publisher).
From a sharded trainer (FSDP2, tensor and pipeline parallel): ``ShardedPublisher(root, mirror,
group=...)`` on every rank publishes one version from the pieces each rank holds, with no gather
(hfdelta.sharded, docs/sharded.md).

Engines the trainer drives: ``Engines(urls, root=ROOT).update(N)`` (hfdelta.engines) brings vLLM
engines serving with the hfdelta backend (hfdelta.vllm, imported by vLLM's workers) to version N:
each pulls N into its host's LOCAL while it serves, then pauses only for the reload.
"""

from __future__ import annotations

# Every public name of the modules below; each module's __all__ lists its own.
from . import _api, engines, errors, publisher, results, sharded
from ._api import *  # noqa: F401,F403
from ._core import __version__
from .engines import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .publisher import *  # noqa: F401,F403
from .results import *  # noqa: F401,F403
from .sharded import *  # noqa: F401,F403

__all__ = ["__version__", "errors", "results", "publisher", "sharded", "engines"]
__all__ += _api.__all__
__all__ += publisher.__all__
__all__ += sharded.__all__
__all__ += engines.__all__
__all__ += results.__all__
__all__ += errors.__all__
