# 2026-12-05, at 43c052d, EPYC-AVX512 (AMD EPYC family 25 model 17, AVX-512, 2 cores): both side by side, one thread each
OMP_NUM_THREADS=1 python -m freshper.profiling.bench_memory --preset smollm2-135m-sokoban --set eval.batch=0 > sokoban-eval-batch-0.txt
OMP_NUM_THREADS=1 python -m freshper.profiling.bench_memory --preset smollm2-135m-sokoban --set eval.batch=8 > sokoban-eval-batch-8.txt
