# mocker's container image: a build stage with the dev dependencies (TypeScript), a run stage with the
# production dependencies only. Nothing is downloaded when the container starts: the bundled Qwen3 tokenizer
# is in node_modules, and a capture file carries its own tokenizer.
#
#   docker build -t mocker .
#   docker run --rm -p 8000:8000 -v "$PWD/captures:/captures:ro" mocker --mode replay
#
# Both base images are Node 20 on Debian bookworm; override them where no registry is reachable
# (docs/deploy.md, "Container image").
ARG BUILD_BASE=node:20-bookworm
ARG RUN_BASE=node:20-bookworm-slim

FROM ${BUILD_BASE} AS build
WORKDIR /app
# better-sqlite3 compiles against the base image's own Node headers when its prebuilt binary cannot be
# fetched: node-gyp downloads nothing.
ENV npm_config_nodedir=/usr/local
COPY package.json package-lock.json ./
# No install scripts but better-sqlite3's: zeromq and tokenizers ship their Linux binaries in their packages,
# and `prepare` (tsc) needs the sources copied below.
RUN npm ci --no-audit --no-fund --ignore-scripts && npm rebuild better-sqlite3
COPY tsconfig.json ./
COPY src ./src
RUN npx tsc -p . && npm prune --omit=dev --ignore-scripts

FROM ${RUN_BASE}
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY scripts/container-entrypoint.sh ./scripts/
# Captures are mounted read-only at /captures (a replay only reads; --on-miss record needs it writable).
# Every flag is also MOCKER_<FLAG>: `-e MOCKER_MODE=replay` is `--mode replay`. Every command listens on
# MOCKER_PORT (capture's own default is 8001): the port exposed and health-checked (set it, not --port, to move it).
ENV NODE_ENV=production \
    MOCKER_CAPTURES=/captures/mocker.db \
    MOCKER_PORT=8000 \
    HF_HOME=/models/huggingface
# A numeric user, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
EXPOSE 8000
# Healthy while mocker takes requests, whichever command runs: /mocker/health is answered by serve (as its
# /health: 503 during --startup-time), pd-proxy and capture themselves (a capture's /health is its upstream's).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s \
  CMD ["node", "-e", "fetch(`http://127.0.0.1:${process.env.MOCKER_PORT}/mocker/health`).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["/app/scripts/container-entrypoint.sh"]
CMD ["serve"]
