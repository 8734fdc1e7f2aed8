"""FreshPER inside TRL's GRPOTrainer with a vision-language model: a tiny Qwen2-VL built offline, a
processor made of its PIL image processor and tokenizer, images of one colour and the question
which colour it is. Replayed completions are scored on the images they were generated from."""
import random

import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForImageTextToText, AutoTokenizer, BatchFeature, ProcessorMixin  # noqa: E402

from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer  # noqa: E402

# ChatML with content parts: an image part renders as Qwen2-VL's placeholder
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
            "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}


class TinyVLProcessor(ProcessorMixin):
    """What a Qwen2-VL processor does for images (no video half, hence no torchvision): text with
    one <|image_pad|> per image, expanded to one per merged patch, with pixel values and grids."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def __call__(self, images=None, text=None, padding=False, return_tensors=None, padding_side=None, **kw):
        from freshper.trainer.model.vision import expand_ids, process

        flat = [im for row in (images or []) for im in (row if isinstance(row, (list, tuple)) else [row])]
        out, counts = {}, []
        if flat:
            out["pixel_values"], out["image_grid_thw"], counts = process(self.image_processor, flat)
        rows, k = [], 0
        for t in text:
            ids = self.tokenizer(t, add_special_tokens=False)["input_ids"]
            n = ids.count(self.image_token_id)
            rows.append(expand_ids(ids, self.image_token_id, counts[k:k + n]))
            k += n
        left = (padding_side or self.tokenizer.padding_side) == "left"
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, sl], att[i, sl] = torch.tensor(r), 1
        out.update(input_ids=ids, attention_mask=att, mm_token_type_ids=(ids == self.image_token_id).int())
        return BatchFeature(out, tensor_type=return_tensors)


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    from freshper.trainer.model.load import SPECIALS
    from freshper.trainer.model.vision import build_tiny_vl, image_processor

    path = build_tiny_vl(tmp_path_factory.mktemp("vl") / "tiny", ["Which colour is the picture?", *COLOURS] * 20,
                         SPECIALS, TEMPLATE)
    return path, TinyVLProcessor(image_processor(path), AutoTokenizer.from_pretrained(path), chat_template=TEMPLATE)


def colour_reward(completions, answer, **kw):
    return [float(a in (c[0]["content"] if isinstance(c, list) else c)) + len(str(c)) / 100 for c, a in
            zip(completions, answer)]


def make(tmp_path, tiny_vl, **over):
    from PIL import Image

    path, proc = tiny_vl
    question = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour is it?"}]}]
    rows = []
    for i in range(16):  # pictures of three sizes: rows with different numbers of image tokens
        c = random.Random(i).choice(list(COLOURS))
        rows.append({"prompt": question, "image": Image.new("RGB", (56, 28 * (2 + i % 3)), COLOURS[c]), "answer": c})
    kw = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
              max_completion_length=6, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
              bf16=False, save_strategy="no", replay_updates=1, replay_tau=10.0, seed=0, lr_scheduler_type="constant")
    kw.update(over)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return FreshPERGRPOTrainer(model=model, reward_funcs=colour_reward, args=FreshPERGRPOConfig(**kw),
                               train_dataset=Dataset.from_list(rows), processing_class=proc)


def test_vlm_completions_are_stored_with_their_images_and_replayed(tmp_path, tiny_vl):
    tr = make(tmp_path, tiny_vl)
    tr.train()
    assert len(tr.replay_buffer) == 8 and "images" in tr.replay_buffer.field_names
    assert [h for h in tr.state.log_history if "replay/loss" in h]
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.replay_steps()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_a_replayed_completion_is_scored_on_its_own_images(tmp_path, tiny_vl):
    """With the policy held fixed (lr 0), a replayed completion's log-probs, recomputed from the
    buffer's PNGs, equal the behaviour log-probs stored when it was generated from the dataset's
    images; repainting a row's picture another colour changes them (the check can fail)."""
    from PIL import Image

    from freshper.images import from_png, pack_pngs, to_png, unpack_pngs

    tr = make(tmp_path, tiny_vl, learning_rate=0.0, replay_updates=0, replay_fill_zero_variance=False,
              replay_tau=1e9)
    tr.args.replay_updates = 1  # store, but never step: the weights stay the ones that generated
    tr.train()
    ids, att, c1, b = tr._replay_batch(8)
    mask = b.completion_mask[:, :c1].bool()
    with torch.no_grad():
        got = tr.replay_logps(tr.model, ids, att, c1, b)
    torch.testing.assert_close(got[mask], b.logp[:, :c1][mask], atol=1e-5, rtol=0)
    rows = unpack_pngs(b.images)
    first = from_png(rows[0][0])
    other = next(c for c in COLOURS.values() if c != first.getpixel((0, 0)))
    rows[0] = [to_png(Image.new("RGB", first.size, other))]
    b.fields["images"] = pack_pngs(rows, b.images.shape[1]).to(b.images.device)
    with torch.no_grad():
        repainted = tr.replay_logps(tr.model, ids, att, c1, b)
    assert (repainted[0][mask[0]] - got[0][mask[0]]).abs().max() > 1e-4
    assert torch.equal(repainted[1:], got[1:]), "the other rows keep their own images"


def test_unsupported_vlm_replay_settings_are_refused(tmp_path, tiny_vl):
    with pytest.raises(ValueError, match="replay_fill_zero_variance with a vision-language model"):
        make(tmp_path, tiny_vl, replay_fill_zero_variance=True)
