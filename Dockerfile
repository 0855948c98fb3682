# syntax=docker/dockerfile:1
# Build stage: compile TypeScript and bundle the console with the full dependency tree.
FROM node:22-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
# The `prepare` script's file only: it builds nothing here (no sources yet); `npm run build` below does.
COPY console/build-on-install.js ./console/
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
# The operator console: built into dist/console, which the runtime stage copies with the rest.
COPY console ./console
RUN npm run build

# Runtime stage: production dependencies, compiled code, migrations and the API contract only.
FROM node:22-bookworm-slim
ENV NODE_ENV=production HOST=0.0.0.0 PORT=8080 TOOLGATE_DATA_DIR=/data
WORKDIR /app
COPY package.json package-lock.json ./
# `prepare` runs here too, and steps aside: no Vite in a production install.
COPY console/build-on-install.js ./console/
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY migrations ./migrations
COPY openapi.yaml ./
# `toolgate` on PATH: operators run `docker exec … toolgate grants list`.
RUN mkdir -p /data && chown node:node /data && ln -s /app/bin/toolgate.js /usr/local/bin/toolgate
# Without DATABASE_URL the embedded database lives in /data, a volume, so it outlives the container.
# Declared after the chown, so that a fresh volume starts owned by node.
VOLUME /data
USER node
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD node -e "fetch('http://127.0.0.1:'+(process.env.PORT||8080)+'/ready').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"
# Memory flags: why in docs/performance.md. Raise the heap ceiling through NODE_OPTIONS for tools
# that answer many megabytes at high concurrency.
ENV NODE_OPTIONS="--max-old-space-size=1024"
CMD ["node", "--max-semi-space-size=32", "dist/server.js"]
