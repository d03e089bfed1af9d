"""What a run writes for people: `metrics` (metrics.jsonl and the learning curve) and `trackers` (MLflow,
TensorBoard, W&B, `--log-to`; the names it takes are checked with the config, `agl_trainer.config.parse_trackers`).
"""
