"""One episode as one token sequence that grows turn by turn (its messages: envs/prompts.py).

The whole episode is one token sequence through the model's chat template; the loss mask covers
the assistant's tokens only. Tokens the model generated are kept exactly as generated (never
re-tokenized): after each reply only the template text that follows it is tokenized and
appended. `Episode` checks that the rendered conversation extends the previous rendering by
exactly the reply, so a chat template that rewrites earlier turns (some strip reasoning from old
replies) fails loudly instead of training on tokens the model never saw.
"""
from __future__ import annotations

# The ChatML-style template (the Qwen2.5 instruct models' format) of the tokenizers built here:
# the tiny model's (trainer/model/load.py) and the random-init byte-level one (random_init.py).
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Episode:
    """The growing token sequence of one episode: ids, a mask of assistant tokens, and the
    engine's log-prob of each assistant token (0 elsewhere). With a VLM's image `processor`, a
    message may show images: its text holds one vision.IMAGE placeholder per image, expanded in
    the ids to one <|image_pad|> per merged patch; the episode keeps each image as PNG bytes and
    as processed pixels."""

    def __init__(self, tokenizer, messages: list[dict], images: list = (), processor=None):
        self.tok = tokenizer
        self.processor = processor
        self.pngs: list[bytes] = []
        self.pixels: list = []  # (patches, D) float32 per image
        self.grids: list = []  # (1, 3) int64 per image
        self.messages = list(messages)
        self.text = self._render()
        self.ids = self._encode(self.text, images)
        self.mask = [False] * len(self.ids)
        self.logp = [0.0] * len(self.ids)
        self._reply_end: int | None = None  # eos id that closed the last reply, if any

    def _render(self) -> str:
        return self.tok.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str, images=()) -> list[int]:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if self.processor is None:
            if images:
                raise ValueError("images given to an episode without an image processor (a text-only model)")
            return ids
        from freshper.images import to_png

        from .vision import expand_ids, process

        pad = self.tok.convert_tokens_to_ids("<|image_pad|>")
        if not images:
            return expand_ids(ids, pad, [])
        pixels, grids, counts = process(self.processor, list(images))
        ids = expand_ids(ids, pad, counts)
        self.pngs += [to_png(im) for im in images]
        self.pixels += list(pixels.split([int(g.prod()) for g in grids]))
        self.grids += list(grids.split(1))
        return ids

    def vision_inputs(self):
        """This episode's ids with its images, as a VLM forward or generate takes them."""
        import torch

        from .vision import VisionInputs

        pad = self.tok.convert_tokens_to_ids("<|image_pad|>")
        if not self.pixels:
            return VisionInputs(self.ids, torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long), pad)
        return VisionInputs(self.ids, torch.cat(self.pixels), torch.cat(self.grids), pad, tuple(self.pngs))

    def add_reply(self, ids: list[int], logps: list[float]) -> str:
        """Append the assistant's reply as generated, with the engine's log-prob per token (an
        empty list for a reply no engine sampled); returns its text (for the environment)."""
        if logps and len(logps) != len(ids):
            raise ValueError(f"a reply of {len(ids)} tokens came with {len(logps)} log-probs")
        eos = self.tok.eos_token_id
        self._reply_end = ids[-1] if ids and ids[-1] == eos else None
        body = ids[:-1] if self._reply_end is not None else ids
        content = self.tok.decode(body, skip_special_tokens=False)
        self.ids += ids
        self.mask += [True] * len(ids)
        self.logp += list(logps) if logps else [0.0] * len(ids)
        self.messages.append({"role": "assistant", "content": content})
        self.text += content
        return content

    def add_user(self, text: str, limit: int | None = None, images: list = ()) -> bool:
        """Append the user's next message (feedback and the next turn; `images` for its
        placeholders). If that would take the sequence past `limit` tokens, append nothing and
        return False."""
        self.messages.append({"role": "user", "content": text})
        full = self._render()
        if not full.startswith(self.text):
            raise ValueError("the chat template rewrote earlier turns; multi-turn episodes need a template that "
                             "only appends (one token sequence per episode)")
        suffix = full[len(self.text):]
        if self._reply_end is not None:  # the reply's own end-of-turn token is already in ids
            end = self.tok.decode([self._reply_end], skip_special_tokens=False)
            if not suffix.startswith(end):
                raise ValueError(f"the chat template does not close a reply with {end!r}, the eos token")
            suffix = suffix[len(end):]
        kept = (list(self.pngs), list(self.pixels), list(self.grids))
        new = self._encode(suffix, images)
        if limit is not None and len(self.ids) + len(new) > limit:
            self.messages.pop()
            self.pngs, self.pixels, self.grids = kept
            return False
        self.ids += new
        self.mask += [False] * len(new)
        self.logp += [0.0] * len(new)
        self.text = full
        return True

    def __len__(self) -> int:
        return len(self.ids)
