"""The SGLang patch: one wrapped method, pinned to SGLang 0.5.23.

``SchedulerBatchResultProcessor._append_prefill_hidden_states`` is where stock SGLang turns a
request's prefill rows into JSON floats (``.cpu().tolist()``), and where it drops the middle chunks
of a chunked prefill. For capture requests (rid ``eaglebox-<sample_id>-<nonce>``) the wrapper hands
the rows -- the concatenated aux layers in ``logits_output.hidden_states`` and the post-norm last
hidden state in ``logits_output.last_hidden_states`` -- to :class:`CaptureSink`, for every chunk,
and puts only a metadata dict into the response. Other requests take the stock path.

Installed by a post-import hook (:mod:`eaglebox.engine.post_import`) in every process, because
SGLang's scheduler is a ``spawn``-ed process.
"""

from __future__ import annotations

import os
import sys

from eaglebox import SGLANG_VERSION
from eaglebox.engine.post_import import on_import

TARGET_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"


class VersionMismatch(RuntimeError):
    pass


def check_sglang_version(found: str) -> None:
    if found != SGLANG_VERSION:
        raise VersionMismatch(
            f"eaglebox's capture hook is written for SGLang {SGLANG_VERSION}, but SGLang {found} is running; "
            f"install sglang=={SGLANG_VERSION} or unset EAGLEBOX_CAPTURE_DIR"
        )


def _captured_layer_inputs(processor) -> list[int] | None:
    """The model's ``layers_to_capture`` (inputs of those layers), read from the running model."""
    worker = getattr(processor, "model_worker", None) or getattr(processor, "tp_worker", None)
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    for _, module in model.named_modules() if model is not None else ():
        layers = getattr(module, "layers_to_capture", None)
        if layers is not None:  # on the decoder stack, wherever a VLM wrapper nests it
            return [int(i) for i in layers]
    return None


def patch(module) -> None:
    import sglang

    from eaglebox.capture.sink import CaptureSink, sample_id_from_rid

    check_sglang_version(sglang.__version__)
    cls = module.SchedulerBatchResultProcessor
    stock = cls._append_prefill_hidden_states
    state: dict = {}

    def sink_for(processor) -> CaptureSink:
        if "sink" not in state:
            header = {"engine": "sglang", "engine_version": sglang.__version__,
                      "captured_layer_inputs": _captured_layer_inputs(processor)}
            state["sink"] = CaptureSink(os.environ["EAGLEBOX_CAPTURE_DIR"],
                                        queue_size=int(os.environ.get("EAGLEBOX_CAPTURE_QUEUE", "8")),
                                        header=header)
        return state["sink"]

    def _append_prefill_hidden_states(self, *, req, logits_output, hidden_state_offset, capture_hidden_mode,
                                      extend_input_len, store=True):
        sid = sample_id_from_rid(req.rid)
        if sid is None or req.return_hidden_states is not True or not capture_hidden_mode.is_full():
            return stock(self, req=req, logits_output=logits_output, hidden_state_offset=hidden_state_offset,
                         capture_hidden_mode=capture_hidden_mode, extend_input_len=extend_input_len, store=store)
        start, end = hidden_state_offset, hidden_state_offset + extend_input_len
        if getattr(self, "tp_rank", 0) != 0:
            return end
        sink = sink_for(self)
        if req.is_retracted or req.finished():
            sink.drop(sid)
            return end
        if logits_output.last_hidden_states is None:
            raise RuntimeError("eaglebox capture needs --enable-return-aux-hidden-states "
                               "(SGLang keeps last_hidden_states only in aux capture mode)")
        meta = sink.add_chunk(sid, req.origin_input_ids, logits_output.hidden_states[start:end],
                              logits_output.last_hidden_states[start:end])
        if meta is not None:
            req.hidden_states.append(meta)
        return end

    cls._append_prefill_hidden_states = _append_prefill_hidden_states
    print(f"[eaglebox] capture hook active in pid {os.getpid()} (SGLang {sglang.__version__})", file=sys.stderr)


def install_import_hook() -> None:
    on_import(TARGET_MODULE, patch)
