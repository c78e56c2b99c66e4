"""The SGLang patch: two wrapped methods, pinned to SGLang 0.5.23.

1. ``SchedulerBatchResultProcessor._append_prefill_hidden_states`` is where stock SGLang turns a
   request's prefill rows into JSON floats (``.cpu().tolist()``), and where it drops the middle
   chunks of a chunked prefill. For capture requests (rid ``eaglebox-<sample_id>-<nonce>``) the
   wrapper hands the rows -- the concatenated aux layers in ``logits_output.hidden_states`` and the
   post-norm last hidden state in ``logits_output.last_hidden_states`` -- to :class:`CaptureSink`,
   for every chunk, and puts only a metadata dict into the response. Other requests take the stock
   path.
2. ``GenerationBatchResult.copy_to_cpu`` also moves ``last_hidden_states`` to the host when it
   moves ``hidden_states``.

Why the rows are safe to keep (CUDA):

- *Overlap scheduling* (the default) runs batch N+1's forward on its own stream while the scheduler
  processes batch N, and prefill CUDA graphs return slices of static buffers that the next replay
  rewrites. SGLang reads ``hidden_states`` for exactly this reason through ``copy_to_cpu``: a copy
  to fresh pinned memory queued on its copy stream right behind batch N's forward, with
  ``copy_done`` recorded after it and synchronised before results are processed. Stock SGLang
  leaves ``last_hidden_states`` on the device there; wrapper 2 queues its copy in the same place,
  before ``copy_done`` is recorded, so both tensors arrive as fresh host tensors that nothing else
  writes.
- *Without overlap*, results are processed on the thread and stream that ran the forward, before
  the next forward is queued; the rows arrive on the device and the sink copies them on that stream
  and waits for the copy before returning (:func:`eaglebox.capture.sink._copy_rows`).
- *Chunked prefill* hands each chunk over separately; the sink keys pending rows by request id.

Only the attention-TP rank 0 of each attention group writes (:func:`writes_on_this_rank`).

The sink hashes and writes in a writer process of its own (:mod:`eaglebox.capture.writer`): threads
in the scheduler's interpreter waited for its GIL at every return from C, since the scheduler thread
runs Python without pause while it drives a GPU (H200: a third of the disk's rate). One thread of the
sink still runs in the scheduler process, to take each written sample's answer (one GIL acquisition per
sample); a Python thread waiting for the GIL gets it after the holder's switch interval, 5 ms by
default, so the hook shortens that (``EAGLEBOX_CAPTURE_SWITCH_INTERVAL_S``, default 0.5 ms) when the
first capture request arrives.

Installed by a post-import hook (:mod:`eaglebox.engine.post_import`) in every process, because
SGLang's scheduler is a ``spawn``-ed process.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from eaglebox import SGLANG_VERSION
from eaglebox.capture.serve_check import layers_to_capture
from eaglebox.engine.post_import import on_import
from eaglebox.shards.requests import sample_id_from_rid
from eaglebox.shards.transport import refused_here

TARGET_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"
RESULT_MODULE = "sglang.srt.managers.utils"


class VersionMismatch(RuntimeError):
    pass


def check_sglang_version(found: str) -> None:
    if found != SGLANG_VERSION:
        raise VersionMismatch(
            f"eaglebox's capture hook is written for SGLang {SGLANG_VERSION}, but SGLang {found} is running; "
            f"install sglang=={SGLANG_VERSION} or unset EAGLEBOX_CAPTURE_DIR"
        )


def writes_on_this_rank(parallel) -> bool:
    """Whether this scheduler process writes capture files, from SGLang's ``ParallelContext``.

    Every attention-TP rank sees every request of its attention group with the full rows (the
    logits processor gathers them), so exactly one rank per group must write: attention-TP rank 0.
    Without ``--enable-dp-attention`` there is one group and that is TP rank 0; with it, each DP
    group schedules its own requests, so each group's attention-TP rank 0 writes its own samples.

    Only the last pipeline stage (``pp_rank == pp_size - 1``) may write: it alone runs the logits
    processor and hooks layers (``set_eagle3_layers_to_capture`` returns on earlier stages). SGLang
    0.5.23 captures nothing under ``--pp-size`` > 1 all the same (it refuses
    ``--enable-return-aux-hidden-states`` with it; every stage, the last too, processes results rebuilt
    from the pipeline's output ring, without hidden states), and eaglebox refuses such a capture before
    a server starts (:func:`eaglebox.engine.launch.check_capture_pipeline`); the rule stands so that
    no earlier stage writes if rows ever reach one. A ``ParallelContext`` without the pipeline fields
    written (SGLang raises on reading them) is one stage."""
    def field(name: str, default: int) -> int:  # SGLang raises RuntimeError/ValueError for an unwritten one
        try:
            return getattr(parallel, name)
        except (AttributeError, RuntimeError, ValueError):
            return default

    return field("pp_rank", 0) == field("pp_size", 1) - 1 and parallel.attn_tp_rank == 0


def _captured_layer_inputs(processor) -> list[int] | None:
    """The model's ``layers_to_capture`` (inputs of those layers), read from the running model."""
    worker = getattr(processor, "model_worker", None) or getattr(processor, "tp_worker", None)
    return layers_to_capture(getattr(getattr(worker, "model_runner", None), "model", None))


def stop_server(message: str) -> None:
    """A capture writer failed: stop the server as SGLang's scheduler does on an exception (its log line,
    then SIGQUIT to the launcher, which takes the server down), so that the client learns it at once and
    names the cause from the log, even when every request was already answered."""
    try:
        print(f"[eaglebox] {message}", file=sys.stderr, flush=True)
    except OSError:  # the log is on the disk that filled up; the client finds that cause itself
        pass
    os.kill(os.getppid(), signal.SIGQUIT)


def patch(module) -> None:
    import sglang
    from sglang.srt.runtime_context import get_parallel

    from eaglebox.capture.sink import CAPTURE_WRITERS, CaptureSink

    check_sglang_version(sglang.__version__)
    cls = module.SchedulerBatchResultProcessor
    stock = cls._append_prefill_hidden_states
    state: dict = {}

    def sink_for(processor) -> CaptureSink:
        if "sink" not in state:
            header = {**json.loads(os.environ.get("EAGLEBOX_CAPTURE_HEADER", "{}")),  # the spec, as launched
                      "engine": "sglang", "engine_version": sglang.__version__,  # and what the engine says
                      "captured_layer_inputs": _captured_layer_inputs(processor)}
            sys.setswitchinterval(float(os.environ.get("EAGLEBOX_CAPTURE_SWITCH_INTERVAL_S", "0.0005")))
            state["sink"] = CaptureSink(os.environ["EAGLEBOX_CAPTURE_DIR"],
                                        buffer_bytes=int(os.environ.get("EAGLEBOX_CAPTURE_BUFFER_BYTES", 4 << 30)),
                                        writers=int(os.environ.get("EAGLEBOX_CAPTURE_WRITERS", CAPTURE_WRITERS)),
                                        nice_writers=os.environ.get("EAGLEBOX_CAPTURE_NICE_WRITERS") == "1",
                                        header=header, on_error=stop_server)
        return state["sink"]

    def _append_prefill_hidden_states(self, *, req, logits_output, hidden_state_offset, capture_hidden_mode,
                                      extend_input_len, store=True):
        sid = sample_id_from_rid(req.rid)
        if sid is None or req.return_hidden_states is not True or not capture_hidden_mode.is_full():
            return stock(self, req=req, logits_output=logits_output, hidden_state_offset=hidden_state_offset,
                         capture_hidden_mode=capture_hidden_mode, extend_input_len=extend_input_len, store=store)
        start, end = hidden_state_offset, hidden_state_offset + extend_input_len
        if not writes_on_this_rank(get_parallel()):
            return end
        refused = refused_here(sid)
        if refused:  # answered, not captured: the writer would fail on it and stop the server
            req.hidden_states.append({"error": refused})
            return end
        sink = sink_for(self)
        if req.is_retracted or req.finished():
            sink.drop(req.rid)
            return end
        if logits_output.last_hidden_states is None:
            raise RuntimeError("eaglebox capture needs --enable-return-aux-hidden-states "
                               "(SGLang keeps last_hidden_states only in aux capture mode)")
        meta = sink.add_chunk(req.rid, sid, req.origin_input_ids, logits_output.hidden_states[start:end],
                              logits_output.last_hidden_states[start:end], owner=req)
        if meta is not None:
            req.hidden_states.append(meta)
        return end

    cls._append_prefill_hidden_states = _append_prefill_hidden_states
    print(f"[eaglebox] capture hook active in pid {os.getpid()} (SGLang {sglang.__version__})", file=sys.stderr)


def patch_copy_to_cpu(module) -> None:
    """Wrapper 2: ``last_hidden_states`` rides SGLang's own device-to-host copy (see the module doc)."""
    from sglang.srt.utils.common import async_d2h

    cls = module.GenerationBatchResult
    stock = cls.copy_to_cpu

    def copy_to_cpu(self, return_logprob: bool, return_hidden_states: bool = True):
        out = self.logits_output
        if return_hidden_states and out is not None and out.last_hidden_states is not None:
            out.last_hidden_states = async_d2h(out.last_hidden_states)  # queued before copy_done
        return stock(self, return_logprob, return_hidden_states)

    cls.copy_to_cpu = copy_to_cpu


def install_import_hook() -> None:
    on_import(TARGET_MODULE, patch)
    on_import(RESULT_MODULE, patch_copy_to_cpu)
