"""A tokenizer class shipped inside the tiny DeepSeek-V3 target's directory, as Kimi-K2.5 ships its own.

Kimi-K2.5's tokenizer is ``tokenization_kimi.TikTokenTokenizer``: a slow ``PreTrainedTokenizer``
subclass in a ``.py`` file beside the weights, wrapping a ``tiktoken`` encoding read from
``tiktoken.model``, named by ``auto_map`` in ``tokenizer_config.json``; transformers (and SGLang)
load it only with ``trust_remote_code``. This class has the same shape around the tiny targets'
byte-level BPE (a ``tokenizers`` file, ``tiny_bpe.json``): ``eaglebox tiny --arch deepseek_v3``
copies this file into the model directory, and the ids it gives are the ids the tiny BPE gives.

Self-contained on purpose: transformers imports it from the model directory, not from eaglebox.
"""

from __future__ import annotations

import os
import shutil

from transformers import PreTrainedTokenizer


class TinyKimiTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiny_bpe.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, bos_token="<|begin_of_text|>", eos_token="<|end|>", pad_token="<|pad|>",
                 **kwargs):
        from tokenizers import Tokenizer

        self.vocab_file = vocab_file
        self.model = Tokenizer.from_file(vocab_file)
        self.encoder: dict[str, int] = self.model.get_vocab(with_added_tokens=True)
        self.decoder: dict[int, str] = {i: t for t, i in self.encoder.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        # the base class has already split the text at the special tokens
        return self.model.encode(text, add_special_tokens=False).tokens

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.model.decoder.decode(tokens)

    def _decode(self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces=None,
                **kwargs) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self.model.decode(ids, skip_special_tokens=skip_special_tokens)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        # like the tiny BPE (no post-processor): the chat template writes the BOS itself
        return list(token_ids_0) + list(token_ids_1 or [])

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        dst = os.path.join(save_directory, name)
        if os.path.abspath(self.vocab_file) != os.path.abspath(dst):
            shutil.copyfile(self.vocab_file, dst)
        return (dst,)
