# FFCA-YOLO training image for NVIDIA GPU servers.
#   docker build -t ffca-yolo .
#   docker run --gpus all --ipc=host -v "$PWD/datasets:/data" -v "$PWD/runs:/app/runs" ffca-yolo \
#       python train.py --data /data/my.yaml --cfg models/ffca-yolo.yaml
# The base image's torch 2.9.0 satisfies requirements.txt (torch>=2.1), so pip keeps it and its CUDA build.
FROM pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime

# libglib2.0-0 is the one shared library opencv-python-headless loads that the base image lacks.
# Versions are not pinned: Ubuntu's archive drops superseded builds, so a pinned version breaks the
# build within weeks, while the pinned base image tag already fixes the distribution release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Requirements first, so editing the code does not reinstall them.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

# cuBLAS needs a fixed workspace for deterministic GEMMs under --deterministic; a fixed hash seed
# keeps set/dict iteration order identical across ranks and runs; unbuffered output keeps the
# log in step with training under `docker logs`.
ENV CUBLAS_WORKSPACE_CONFIG=:4096:8 \
    PYTHONHASHSEED=0 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib

# A non-root user whose uid matches the usual first host user, so a bind-mounted runs/ folder
# stays writable and its files stay owned by that user (the base image is Ubuntu 22.04, where
# uid 1000 is free). Numeric USER so Kubernetes' runAsNonRoot can verify it.
RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash ffca \
    && mkdir -p /app/runs \
    && chown 1000:1000 /app /app/runs

COPY --chown=1000:1000 . .

USER 1000:1000

CMD ["python", "-m", "utils.determinism.env"]
