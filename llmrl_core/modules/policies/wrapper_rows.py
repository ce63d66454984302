"""How a policy wrapper reads its TensorDict input into token rows and writes its rows back as TorchRL's output
containers, in each input mode and layout (:class:`WrapperRows`, a part of
:class:`~llmrl_core.modules.policies.llm_wrapper_base.LLMWrapperBase`; see there for the layouts and where llmrl
differs from TorchRL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import (
    MetaData,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    lazy_stack,
)
from tensordict.utils import NestedKey

from llmrl_core.data.history import History
from llmrl_core.data.tensors import as_padded_tensor
from llmrl_core.modules.policies.outputs import ChatHistory, LogProbs, Masks, Text, Tokens


class WrapperRows:
    """The input readers (history, text, tokens; masks) and the computation (generate, score) of a wrapper, on the
    attributes its ``_setup`` sets and the backend's ``_generate_rows`` / ``_score_rows``."""

    # --- input ----------------------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"{type(self).__name__} needs a tokenizer for input_mode={self.input_mode!r}")
        return self.tokenizer

    def _template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.chat_template_name is not None:
            kwargs["chat_template_name"] = self.chat_template_name
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        return kwargs

    def _input_history(self, td: TensorDictBase) -> History:
        if self.input_key not in td.keys(True):
            raise ValueError(
                f"Expected '{self.input_key}' key for history input mode, but found keys: {list(td.keys())}"
            )
        history = td.get(self.input_key)
        if not isinstance(history, History):
            raise TypeError(f"Expected History object for '{self.input_key}', got {type(history)}")
        return history

    def _input_text(self, td: TensorDictBase) -> list[str]:
        if self.input_key not in td.keys(True):
            raise ValueError(f"Expected '{self.input_key}' key for text input mode, but found keys: {list(td.keys())}")
        text = td.get(self.input_key)
        if text is None:
            raise ValueError(f"Expected '{self.input_key}' key for text input mode")
        if isinstance(text, (NonTensorStack, NonTensorData)):
            text = text.tolist()
        if not isinstance(text, list):
            raise ValueError(f"Expected list of text for text input, got {type(text)}")
        return [str(t) for t in text]

    def _tokenize_texts(self, texts: list[str]) -> list[torch.Tensor]:
        tokenizer = self._require_tokenizer()
        kwargs = {
            k: v for k, v in self.tokenizer_kwargs.items() if k not in ("padding", "return_tensors", "padding_side")
        }
        encoded = tokenizer(texts, padding=False, **kwargs)
        return [torch.as_tensor(ids, dtype=torch.long) for ids in encoded["input_ids"]]

    def _token_rows(self, td: TensorDictBase, key: NestedKey) -> list[torch.Tensor] | None:
        """The token ids under ``key`` as one 1-D tensor per element, padding removed (None if absent).

        A padded tensor is cut by its attention mask; without one, only the runs of ``padding_value`` at either end
        are padding (prompts pad on the left, responses on the right): the same id inside a row is a real token
        (SmolLM2's pad token is its ``<|im_end|>``, which closes every chat turn)."""
        if key not in td.keys(True):
            return None
        value = td.get(key, as_list=True)
        if isinstance(value, torch.Tensor) and not value.is_nested:
            if value.ndim == 1:
                value = value.unsqueeze(0)
            mask = self._mask_rows(td)
            if mask is None:
                return [_strip_pad_runs(row, self.padding_value).long() for row in value]
            return [row[m.to(row.device).bool()].long() for row, m in zip(value, mask, strict=True)]
        return [torch.as_tensor(row).long().reshape(-1) for row in value]

    def _mask_rows(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        for key in (("masks", "all_attention_mask"), self.attention_mask_key):
            if key in td.keys(True):
                mask = td.get(key, as_list=True)
                if isinstance(mask, torch.Tensor) and not mask.is_nested and mask.ndim == 1:
                    mask = mask.unsqueeze(0)
                return list(mask)
        return None

    def _assistant_mask_rows(self, td: TensorDictBase) -> list[torch.Tensor] | None:
        key = ("masks", "all_assistant_mask")
        if key not in td.keys(True):
            return None
        value = td.get(key, as_list=True)
        if value is None:
            return None
        return [torch.as_tensor(v).bool() for v in value]

    # --- the computation ------------------------------------------------------------------------------
    def _compute(self, td: TensorDictBase, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        if self.generate:
            return self._compute_generate(td)
        return self._compute_score(td)

    def _compute_generate(self, td: TensorDictBase) -> TensorDictBase:
        history = None
        text_prompt: list[str] | None = None
        prompts: list[torch.Tensor] | None = None
        if self.input_mode == "history":
            history = self._input_history(td)
            if self.prefer_tokens:
                prompts = self._token_rows(td, (self.tokens_key, "prompt"))
                if prompts is None:
                    prompts = self._token_rows(td, (self.tokens_key, "full"))
            tokenizer = self._require_tokenizer()
            if prompts is not None:
                text_prompt = tokenizer.batch_decode([p.tolist() for p in prompts], skip_special_tokens=False)
            else:
                text_prompt = history.apply_chat_template(
                    tokenizer=tokenizer, add_generation_prompt=True, **self._template_kwargs()
                )
                encoded = history.apply_chat_template(
                    tokenizer=tokenizer,
                    add_generation_prompt=True,
                    tokenize=True,
                    padding=False,
                    return_dict=True,
                    return_assistant_tokens_mask=False,
                    **self._template_kwargs(),
                )
                prompts = [t.long() for t in encoded.get("input_ids", as_list=True)]
        elif self.input_mode == "text":
            text_prompt = self._input_text(td)
            prompts = self._tokenize_texts(text_prompt)
        else:
            if self.input_key not in td.keys(True):
                raise ValueError(
                    f"Expected '{self.input_key}' key for tokens input mode, but found keys: {list(td.keys())}"
                )
            prompts = self._token_rows(td, self.input_key)
        assert prompts is not None
        samples = self._engine_rows(prompts) if self.engine is not None else self._generate_rows(prompts)
        n = self.num_samples
        flat_prompts = [p for p in prompts for _ in range(n or 1)]
        flat = [sample for row in samples for sample in row]
        responses = [sample[0].long().cpu() for sample in flat]
        log_probs = [sample[1] for sample in flat]
        finish_reasons = [sample[3] if len(sample) > 3 else None for sample in flat]
        tokenizer = self.tokenizer
        text_response = (
            tokenizer.batch_decode([r.tolist() for r in responses], skip_special_tokens=False)
            if tokenizer is not None
            else None
        )
        if flat and all(len(sample) > 2 for sample in flat):  # the engine's own text
            text_response = [sample[2] for sample in flat]
        flat_text_prompt = [t for t in text_prompt for _ in range(n or 1)] if text_prompt is not None else None

        # per-sample tensors, padded the TorchRL way when asked
        prompt_rows = [p.cpu() for p in flat_prompts]
        full_rows = [torch.cat([p, r]) for p, r in zip(prompt_rows, responses, strict=True)]
        mask_rows = [torch.ones(f.numel(), dtype=torch.bool) for f in full_rows]
        lp_rows = [lp.float().cpu() for lp in log_probs] if self.return_log_probs else None
        if self.pad_output:
            pad = self.padding_value if self.padding_value is not None else 0
            prompt_pad, prompt_mask = as_padded_tensor(prompt_rows, pad, "left", return_mask=True)
            resp_pad, resp_mask = as_padded_tensor(responses, pad, "right", return_mask=True)
            prompt_pad, resp_pad = prompt_pad.long(), resp_pad.long()
            if resp_pad.ndim != 2 or resp_pad.shape[0] != len(responses):
                resp_pad = torch.full((len(responses), 0), pad, dtype=torch.long)
                resp_mask = torch.zeros((len(responses), 0), dtype=torch.bool)
            full_pad = torch.cat([prompt_pad, resp_pad], -1)
            full_mask = torch.cat([prompt_mask, resp_mask], -1)
            prompt_rows, responses, full_rows, mask_rows = (
                list(prompt_pad),
                list(resp_pad),
                list(full_pad),
                list(full_mask),
            )
            if lp_rows is not None:
                lp_pad = torch.zeros(resp_pad.shape, dtype=torch.float32)
                for i, lp in enumerate(lp_rows):
                    lp_pad[i, : lp.numel()] = lp
                lp_rows = list(lp_pad)

        response_histories = None
        if self.input_mode == "history":
            assert history is not None and flat_text_prompt is not None and text_response is not None
            prompt_histories = [history[i] for i in range(history.batch_size[0]) for _ in range(n or 1)]
            response_histories = self._response_histories(prompt_histories, flat_text_prompt, text_response)

        rows = []
        for i in range(len(flat)):
            row = TensorDict()
            if self.return_text:
                row.set(
                    self.text_key,
                    Text(
                        prompt=flat_text_prompt[i] if flat_text_prompt is not None else None,
                        response=text_response[i] if text_response is not None else None,
                        full=flat_text_prompt[i] + text_response[i]
                        if flat_text_prompt is not None and text_response is not None
                        else None,
                        batch_size=[],
                    ),
                )
            row.set(
                self.tokens_key,
                Tokens(
                    prompt=prompt_rows[i],
                    response=responses[i],
                    full=full_rows[i],
                    batch_size=[],
                ),
            )
            row.set(self.masks_key, Masks(all_attention_mask=mask_rows[i], batch_size=[]))
            if lp_rows is not None:
                row.set(self.log_probs_key, LogProbs(response=lp_rows[i], batch_size=[]))
            if finish_reasons[i] is not None:
                row.set_non_tensor("finish_reason", finish_reasons[i])
            if response_histories is not None:
                prompt_h, response_h = prompt_histories[i], response_histories[i]
                row.set(
                    self.history_key,
                    ChatHistory(
                        prompt=prompt_h,
                        response=response_h,
                        full=prompt_h.extend(response_h, inplace=False, dim=-1),
                        batch_size=[],
                    ),
                )
            rows.append(row)
        return self._stack_rows(rows, len(prompts))

    def _stack_rows(self, rows: list[TensorDictBase], batch: int | None = None) -> TensorDictBase:
        """Lazy-stack per-sample rows into ``(B,)`` (or ``(B, n)`` with samples) and mark the containers'
        ``padded`` flag once for the batch, as TorchRL does."""
        if self.num_samples is None or batch is None:
            out = lazy_stack(rows)
        else:
            n = self.num_samples
            out = lazy_stack([lazy_stack(rows[i * n : (i + 1) * n]) for i in range(batch)])
        for key in (self.tokens_key, self.masks_key, self.log_probs_key):
            if key in out.keys(True):
                out.get(key).padded = MetaData(self.pad_output)
        return out

    def _response_histories(
        self, prompt_histories: Sequence[History], text_prompt: Sequence[str], text_response: Sequence[str]
    ) -> list[History]:
        """The messages a response adds to its prompt, parsed from the rendered text as TorchRL does; all padded
        to one count with ``"<none>"`` messages."""
        out = []
        for prompt_h, prompt_txt, response_txt in zip(prompt_histories, text_prompt, text_response, strict=True):
            parsed = None
            try:
                parsed = History.from_text(
                    prompt_txt + response_txt, chat_template_name=self.chat_template_name, tokenizer=self.tokenizer
                )
            except Exception:  # noqa: BLE001 - an unparsable text falls back to one assistant message
                parsed = None
            count = prompt_h.batch_size[0]
            if parsed is not None and parsed.batch_size[0] > count:
                out.append(parsed[count:])
            elif parsed is not None and parsed.batch_size[0] == count:
                out.append(History.from_chats([{"role": "assistant", "content": ""}]))
            else:
                out.append(History.from_chats([{"role": "assistant", "content": response_txt}]))
        longest = max((h.batch_size[0] for h in out), default=0)
        padded = []
        for h in out:
            missing = longest - h.batch_size[0]
            if missing:
                filler = History.from_chats([{"role": "<none>", "content": ""} for _ in range(missing)])
                h = h.extend(filler, inplace=False, dim=-1)
            padded.append(h)
        return padded

    def _compute_score(self, td: TensorDictBase) -> TensorDictBase:
        history = None
        text_full: list[str] | None = None
        assistant_rows: list[torch.Tensor] | None = None
        if self.input_mode == "history":
            history = self._input_history(td)
            tokenizer = self._require_tokenizer()
            text_full = history.apply_chat_template(
                tokenizer=tokenizer, add_generation_prompt=False, **self._template_kwargs()
            )
            encoded = history.apply_chat_template(
                tokenizer=tokenizer,
                add_generation_prompt=False,
                tokenize=True,
                padding=False,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **self._template_kwargs(),
            )
            sequences = [t.long() for t in encoded.get("input_ids", as_list=True)]
            if "assistant_masks" in encoded.keys():
                assistant_rows = [m.bool() for m in encoded.get("assistant_masks", as_list=True)]
        elif self.input_mode == "text":
            text_full = self._input_text(td)
            sequences = self._tokenize_texts(text_full)
            assistant_rows = self._assistant_mask_rows(td)
        else:
            if self.input_key not in td.keys(True):
                raise ValueError(
                    f"Expected '{self.input_key}' key for tokens input mode, but found keys: "
                    f"{list(td.keys(isinstance(self.input_key, tuple)))}"
                )
            sequences = self._token_rows(td, self.input_key)
            assert sequences is not None
            assistant_rows = self._assistant_mask_rows(td)
        for i, seq in enumerate(sequences):
            if seq.numel() == 0:
                raise ValueError(
                    "Input contains empty sequences. Packing/padding requires at least one token per sequence."
                    f" (sequence {i})"
                )
        log_probs = [lp.float() for lp in self._score_rows(sequences)]
        token_rows = [s.cpu() for s in sequences]
        mask_rows = [torch.ones(s.numel(), dtype=torch.bool) for s in token_rows]
        if self.pad_output:
            pad = self.padding_value if self.padding_value is not None else 0
            tokens_pad, mask_pad = as_padded_tensor(token_rows, pad, "left", return_mask=True)
            token_rows, mask_rows = list(tokens_pad.long()), list(mask_pad)
            log_probs = list(_pad_left(log_probs))
            if assistant_rows is not None and self.input_mode == "history":
                assistant_rows = list(as_padded_tensor([a.long() for a in assistant_rows], 0, "left").bool())
        rows = []
        for i in range(len(sequences)):
            row = TensorDict()
            if self.return_text:
                row.set(self.text_key, Text(full=text_full[i] if text_full is not None else None, batch_size=[]))
            row.set(self.tokens_key, Tokens(full=token_rows[i], batch_size=[]))
            row.set(
                self.masks_key,
                Masks(
                    all_attention_mask=mask_rows[i],
                    all_assistant_mask=assistant_rows[i] if assistant_rows is not None else None,
                    batch_size=[],
                ),
            )
            row.set(self.log_probs_key, LogProbs(full=log_probs[i], batch_size=[]))
            if history is not None:
                row.set(self.history_key, ChatHistory(full=history[i], batch_size=[]))
            rows.append(row)
        return self._stack_rows(rows)


def _pad_left(rows: list[torch.Tensor]) -> torch.Tensor:
    """Left-pad 1-D float tensors with 0 into ``(B, T)``, keeping any autograd graph."""
    longest = max(r.numel() for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (longest - r.numel(), 0)) for r in rows])


def _strip_pad_runs(row: torch.Tensor, pad: int | None) -> torch.Tensor:
    """``row`` without the runs of ``pad`` at its start and its end (None: nothing is padding)."""
    if pad is None:
        return row
    real = (row != pad).nonzero()
    if real.numel() == 0:
        return row[:0]
    return row[int(real[0]) : int(real[-1]) + 1]
