from django.urls import path

from chatapp.observability import views

urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("admin/latency/", views.dashboard_page, name="latency-dashboard"),
    path("admin/latency/data", views.dashboard_data, name="latency-data"),
    path("admin/latency/benchmarks", views.start_benchmark, name="latency-benchmark"),
    path("admin/latency/jobs/<int:pk>/file", views.job_file, name="latency-job-file"),
    path("admin/latency/jobs/<int:pk>/cancel", views.cancel_job, name="latency-job-cancel"),
    path("admin/latency/tuning", views.start_tuning, name="latency-tuning"),
    path("admin/latency/tuning/<int:pk>/apply", views.apply_tuning, name="latency-tuning-apply"),
]
