"""The Celery app the workers run: `celery -A fugu_pipeline.defs.celery_app worker -Q dagster`.

Built from the same FUGU_CELERY_BROKER / FUGU_CELERY_BACKEND the executor reads
(defs/distributed.py), with dagster-celery's queue and task (`execute_plan`).
"""

from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_task

from fugu_pipeline.defs.distributed import celery_app_args

app = make_app(celery_app_args())
execute_plan = create_task(app)
