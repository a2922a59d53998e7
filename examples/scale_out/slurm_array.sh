#!/bin/bash
# One batch job on N hosts of a Slurm cluster, against one PostgreSQL database
# (docs/scale-out.md). Submit with:  sbatch --array=0-7 examples/scale_out/slurm_array.sh
# Each array task is one host running `autotune tune` on every GPU it was given; the database
# shares the job's problems and budgets out among them. A task that dies is noticed by the
# others (heartbeat) and its trials re-run; re-submitting the array resumes the job.
#SBATCH --job-name=autotune
#SBATCH --array=0-7
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16
#SBATCH --mem=64G
#SBATCH --time=02:00:00
#SBATCH --output=results/slurm-%A_%a.log
set -euo pipefail

# The password is never on a command line (where `ps` and the job records would show it):
# libpq reads it from a password file, mode 0600, lines host:port:database:user:password.
export PGPASSFILE="${PGPASSFILE:-$HOME/.autotune.pgpass}"
DB="postgresql://autotune@db.cluster.internal:5432/autotune"

srun python3 -m autotune tune jobs/nightly.toml \
    --db "$DB" \
    --gpus all \
    --results-dir "results/host-${SLURM_ARRAY_TASK_ID}"
