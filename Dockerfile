# S1-mini Studio on an NVIDIA GPU: the web UI and REST API (`docker run ... ` serves on 7860), or
# Amazon SageMaker's inference contract (`docker run ... serve` serves the API on 8080).
#   docker build -t s1-mini-studio .
#   docker run --gpus all -p 7860:7860 -e HF_TOKEN=... -v s1-hf:/data/huggingface s1-mini-studio
#   docker run --gpus all -p 7860:7860 s1-mini-studio --demo          # no download, no network
#   docker build --build-arg WITH_RAY=1 -t s1-mini-studio-ray .        # for Ray Serve / KubeRay nodes
# BASE: any image with CUDA's runtime and Python 3.10+ (python3, venv) works; the default is NVIDIA's.
ARG BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
# WITH_RAY=1: Ray Serve too (requirements-ray.txt), and wget, which KubeRay's health probes run.
ARG WITH_RAY=0
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# ffmpeg from the OS (PATH first; the imageio-ffmpeg wheel stays as the fallback); libsndfile for
# soundfile; tini is not needed: the server is PID 1 and handles SIGTERM itself.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ffmpeg libsndfile1 ca-certificates \
    $(if [ "$WITH_RAY" = 1 ]; then echo wget; fi) \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/s1-mini-studio
# The dependencies first, so a code change reuses this layer. torch from PyTorch's CUDA index
# (TORCH_INDEX="" takes PyPI's default build).
COPY pyproject.toml requirements.txt requirements-ray.txt ./
RUN if [ -n "$TORCH_INDEX" ]; then pip install "torch>=2.11" --index-url "$TORCH_INDEX"; fi \
 && pip install -r requirements.txt \
 && if [ "$WITH_RAY" = 1 ]; then pip install -r requirements-ray.txt; fi
COPY README.md ./
COPY app ./app
COPY engine ./engine
COPY assets ./assets
RUN pip install --no-deps --no-build-isolation . && python3 -c "import app.launcher, engine.facade"

# The server listens on every address in the container (not 127.0.0.1, which the host cannot reach).
# Volumes: the Hugging Face cache (the checkpoint), compiled kernels, saved voices. One /data tree,
# writable by the unprivileged user and by root (SageMaker runs containers as root).
ENV HF_HOME=/data/huggingface \
    S1_MINI_CACHE_DIR=/data/cache \
    S1_MINI_VOICES_DIR=/data/voices \
    GRADIO_SERVER_NAME=0.0.0.0 \
    S1_MINI_DRAIN_SECONDS=25 \
    XDG_CACHE_HOME=/data/xdg-cache \
    HOME=/data/home
RUN useradd --uid 1000 --create-home --home-dir /data/home s1 \
 && mkdir -p /data/huggingface /data/cache /data/voices /data/xdg-cache \
 && chown -R 1000:1000 /data && chmod -R a+rwX /data
VOLUME ["/data/huggingface", "/data/cache", "/data/voices"]
# Unprivileged by default. `docker run --user root` works too (SageMaker runs containers as root);
# RUN_AS=0 makes root the default, for platforms whose volumes only root can write (RunPod).
ARG RUN_AS=1000
USER ${RUN_AS}

EXPOSE 7860 8080
# /health answers as soon as the server listens; the model loads before that, so give it time
# (a first start downloads the checkpoint and compiles).
# The app's port (7860) or serve mode's (8080): healthy when either answers.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 \
  CMD ["python3", "-m", "app.healthcheck"]

# Exec form: the server is PID 1 and gets SIGTERM itself, then lets requests in flight finish
# (S1_MINI_DRAIN_SECONDS) before exiting. Arguments after the image name are the launcher's flags,
# or `serve` for SageMaker.
ENTRYPOINT ["s1-mini-studio"]
CMD []
