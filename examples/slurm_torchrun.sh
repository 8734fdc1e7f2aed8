#!/bin/bash
# FreshPER on several nodes under SLURM: one torchrun per node, 8 GPUs each, rendezvous on the
# first node. The run folder must be on a filesystem every node sees (rank 0 writes the logs,
# every rank writes its checkpoint shard). Resume with --resume /shared/runs/NAME instead of
# --preset (any number of nodes).
#SBATCH --job-name=freshper --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=64
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 8 \
    --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$head:29500" \
    -m freshper.trainer.cli train --preset qwen2.5-0.5b-sokoban-simple --train.run_dir /shared/runs
