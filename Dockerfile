# The image every service of docker-compose.yml runs: the project, its torch, and the tensorboard, numba
# (the scheduler's compiled update) and plot extras.
# Build: docker compose build   (or: docker build -t aesrl-queue .)
# torch from the default index is the CUDA build, which the GPU critic needs and which also runs on
# CPU; pass --build-arg TORCH_SPEC=... (and PIP_INDEX_URL) for a smaller CPU-only image.
FROM python:3.11-slim

ARG TORCH_SPEC=torch==2.13.0
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1

WORKDIR /app
# `aesrl-queue worker` starts a replica of the primary on every worker machine: the same Redis as
# docker-compose.yml's primary (a replica must be as new as its source to load its data), built for
# the same Debian as this image.
COPY --from=redis:7.4-bookworm /usr/local/bin/redis-server /usr/local/bin/redis-server
RUN pip install --no-cache-dir "$TORCH_SPEC"
COPY setup.cfg pyproject.toml README.md ./
COPY aesrl_queue aesrl_queue
COPY workers workers
COPY scheduler scheduler
COPY cli cli
RUN pip install --no-cache-dir ".[tensorboard,numba,plot]"

CMD ["aesrl-queue", "--help"]
