"""The retrieval benchmark runs at a small size and finds the passages its queries come from."""
from freshper.profiling.bench_retrieval import bench, corpus, main, queries


def test_queries_come_from_the_corpus_and_are_found(capsys):
    ps = corpus(300)
    assert len(ps) == 300 and all(len(p["text"].split()) == 100 for p in ps)
    assert all(any(q in p["text"] for p in ps) for q in queries(ps, 20))
    r = bench(300, 16, 1)
    assert r["passages"] == 300 and r["hit_at_3"] >= 0.8 and r["batch_ms"] > 0
    main(["--sizes", "200", "--queries", "8", "--reps", "1"])
    assert "| 2e+02 |" in capsys.readouterr().out
