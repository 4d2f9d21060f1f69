"""What a run keeps and shows: processes, checkpoints, resume, metrics, tracking, progress, report;
and the HTTP client that reward servers and vLLM servers are called with.

    distributed   torch.distributed set-up, sharding and collectives (one process is a world of one)
    checkpoint    checkpoints written whole or not at all, verified; the run directory's lock
    resume        what a resume restores and checks (data, config, files cut back to the checkpoint)
    metrics       the metrics of a step, with their names
    tracking      metrics.jsonl, TensorBoard, Weights & Biases, MLflow
    progress      progress lines on stderr
    report        report.html and its plots
    http          one HTTP client with one deadline over connecting, sending and every read
"""
