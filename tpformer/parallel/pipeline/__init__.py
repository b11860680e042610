"""Pipeline parallelism: schedules, stage partitioning and the point-to-point runner."""
