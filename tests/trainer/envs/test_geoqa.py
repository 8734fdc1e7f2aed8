"""GeoQA: procedural figures whose answers are computed, GeoQA-R1V-style datasets, and the
errors for rows whose images are missing or unreadable."""
import io
import json

import pytest

from freshper.trainer.envs import make_env
from freshper.trainer.envs.base import EVAL_SEED_BASE
from freshper.trainer.envs.geoqa import figure, gold, load_rows


def png_bytes(colour=(200, 10, 10), size=(40, 30)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def test_procedural_figures_are_a_function_of_the_seed_and_answers_are_computed():
    a, b = figure(3), figure(3)
    assert a[0].tobytes() == b[0].tobytes() and a[1:] == b[1:]
    questions = set()
    for s in range(200):
        _, q, ans = figure(s)
        questions.add(q)
        assert ans.isdigit() and int(ans) > 0
        assert not any(ch.isdigit() for ch in q), "the numbers are in the picture only"
    assert len(questions) == 4
    _, _, ans = next(figure(s) for s in range(50) if "hypotenuse" in figure(s)[1])
    assert ans in {"5", "10", "13", "17", "15"}


def test_the_reply_is_scored_on_its_box():
    env = make_env("geoqa")
    env.reset(0)
    assert env.images()[0].size == (112, 112)
    r = env.step(f"so \\boxed{{{env.answer}}}")
    assert r.reward == 1.0 and r.success and r.valid and r.done
    env.reset(0)
    r = env.step("no box here")
    assert r.reward == 0.0 and not r.valid and r.penalty == -0.15
    env.reset(EVAL_SEED_BASE)  # held out: seeds training never draws
    assert env.question


def test_gold_answers_in_the_geoqa_r1v_forms():
    assert gold("<answer> B </answer>") == "B"
    assert gold("so the area is \\boxed{12}") == "12"
    assert gold("  7 ") == "7"


def test_a_dataset_with_image_bytes_and_paths(tmp_path):
    import pandas as pd

    (tmp_path / "fig.png").write_bytes(png_bytes((0, 0, 255)))
    pd.DataFrame({"image": [{"bytes": png_bytes(), "path": None}, {"bytes": None, "path": "fig.png"},
                            {"bytes": png_bytes((0, 255, 0)), "path": None}],
                  "problem": ["q0", "q1", "q2"], "solution": ["<answer>A</answer>", "\\boxed{3}", "5"]}
                 ).to_parquet(tmp_path / "geo.parquet")
    rows = load_rows(str(tmp_path / "geo.parquet"), "problem", "solution", "image")
    assert [r[1:] for r in rows] == [("q0", "A"), ("q1", "3"), ("q2", "5")]
    assert rows[1][0].getpixel((0, 0)) == (0, 0, 255)
    env = make_env("geoqa", data=str(tmp_path / "geo.parquet"), answer_key="solution")
    env.reset(0)
    assert env.question == "q0" and env.images()[0].getpixel((1, 1)) == (200, 10, 10)
    env.reset(EVAL_SEED_BASE)
    assert env.question == "q2", "the last tenth (at least one row) is held out"


def test_rows_without_a_readable_image_are_named(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    lines = [{"image": "broken.png", "problem": "q", "answer": "1"}]
    (tmp_path / "bad.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    with pytest.raises(ValueError, match="the image of row 0 of .*bad.jsonl cannot be read"):
        load_rows(str(tmp_path / "bad.jsonl"), "problem", "answer", "image")
    lines = [{"image": "missing.png", "problem": "q", "answer": "1"}]
    (tmp_path / "missing.jsonl").write_text(json.dumps(lines[0]))
    with pytest.raises(ValueError, match="the image of row 0 .* cannot be read: .*missing.png"):
        load_rows(str(tmp_path / "missing.jsonl"), "problem", "answer", "image")
    (tmp_path / "none.jsonl").write_text(json.dumps({"image": None, "problem": "q", "answer": "1"}))
    with pytest.raises(ValueError, match="row 0 of .*none.jsonl has no image"):
        load_rows(str(tmp_path / "none.jsonl"), "problem", "answer", "image")
    (tmp_path / "nocol.jsonl").write_text(json.dumps({"problem": "q", "answer": "1"}))
    with pytest.raises(ValueError, match="env.image_key='image' is not a column"):
        load_rows(str(tmp_path / "nocol.jsonl"), "problem", "answer", "image")
