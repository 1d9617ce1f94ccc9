#!/usr/bin/env bash
# Fills a running `gangway dev` with a realistic mix for the web view's screenshots:
# queues (two teams under one org queue), placed gangs of 2–16 GPU workers in every
# zone, NonStrict gangs, and gangs that wait (too large for any node, a zone that is
# full, a queue over its max). Usage: fleet-mix.sh GANGCTL GRPC_ADDR
set -euo pipefail
G="$1 -s $2"
$G queues put org --max nvidia.com/gpu=1600 >/dev/null
$G queues put research --parent org --weight 2 --min nvidia.com/gpu=512 --lend nvidia.com/gpu=256 >/dev/null
$G queues put prod --parent org --weight 3 --min nvidia.com/gpu=640 >/dev/null
$G queues put batch --max nvidia.com/gpu=64,cpu=512 >/dev/null
gang() { # name queue namespace count gpus zone mode
  local selector=""
  [ -n "$6" ] && selector="nodeSelector: {topology.kubernetes.io/zone: $6}"
  $G submit -f - >/dev/null <<YAML
name: $1
idempotencyKey: $1
queue: $2
gangs:
  - name: $1
    namespace: $3
    minMember: $4
    mode: $7
    waitTime: 30m
    members:
      - name: worker
        count: $4
        pod:
          requests: {cpu: "8", memory: 32Gi, nvidia.com/gpu: $5}
          $selector
YAML
}
for i in $(seq 1 14); do gang "llm-pretrain-$i" prod team-llm 16 8 "" Strict; done
for i in $(seq 1 30); do gang "vision-sweep-$i" research team-vision 4 3 zone-b Strict; done
for i in $(seq 1 24); do gang "rl-rollout-$i" research team-rl 8 1 zone-a NonStrict; done
for i in $(seq 1 16); do gang "etl-$i" batch data-eng 2 5 zone-c Strict; done
gang "giant-moe-1" prod team-llm 64 8 zone-a Strict
gang "wide-node-1" research team-vision 2 9 "" Strict
for i in $(seq 1 6); do gang "vision-late-$i" research team-vision 16 8 zone-b Strict; done
