"""A job's metrics: recorded by every process of a job (:mod:`.recording`), shown as a
summary and Prometheus text (:mod:`.exposition`), served by the supervisor (:mod:`.endpoint`)."""
