"""Jobs: the list, the job page (summary, loss chart, actions, events, log) and the job actions.

The job page is the change page with a summary on top (console/templates/admin/jobs/trainingjob/
change_form.html); the raw fields stay below it, folded. Its buttons post to the job's action
URLs, which go through ``run_job_action`` and so through the same services as the API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from console.admin import charts, dashboard, queries
from console.admin.common import STATUS_COLORS, ModelAdmin, admin_actor, colored, run_job_action
from jobs.models import TrainingJob
from jobs.services.core import jobs as job_services
from jobs.states import TERMINAL

NONE = "\u2013"  # an en dash: nothing to show
ADMIN_EVENTS = queries.EVENTS_PAGE  # events shown on a page of a job's events

# Fields of the request as submitted, shown folded on the job page; the rest of the row
# (status, metrics, counters) under "Raw state". Priority alone stays editable.
REQUEST_FIELDS = (
    "public_id", "project", "created_by", "model", "method", "parent_model", "parent_job",
    "parent_step", "training_file", "validation_file", "adapter", "hyperparameters", "seed", "suffix", "target", "max_runtime_seconds",
    "max_attempts", "gpu", "node_selector", "max_price_per_hour", "metadata",
)  # fmt: skip


@dataclass(frozen=True)
class JobAction:
    name: str
    label: str
    verb: str  # run_job_action's message: "<verb> 1 job(s)."
    service: Callable[..., Any]
    confirm: bool = False  # a confirmation page comes first
    danger: bool = False


def _actions() -> dict[str, JobAction]:
    # Looked up when used, so the services stay the ones the module holds at call time.
    return {
        "pause": JobAction("pause", "Pause", "Paused", job_services.job_pause),
        "resume": JobAction("resume", "Resume", "Resumed", job_services.job_resume),
        "retry": JobAction("retry", "Retry", "Requeued", job_services.job_retry),
        "cancel": JobAction(
            "cancel", "Cancel", "Cancelled", job_services.job_cancel, confirm=True, danger=True
        ),
    }


def _bulk(
    name: str,
) -> Callable[[admin.ModelAdmin[TrainingJob], HttpRequest, QuerySet[TrainingJob]], None]:
    """The list page's "<Name> selected jobs": the same service and verb as the page's button."""

    def run(
        modeladmin: admin.ModelAdmin[TrainingJob],
        request: HttpRequest,
        queryset: QuerySet[TrainingJob],
    ) -> None:
        action = _actions()[name]
        run_job_action(modeladmin, request, queryset, action.service, action.verb)

    run.__name__ = f"{name}_jobs"  # the action's name in the list page's form
    return admin.action(description=f"{name.title()} selected jobs")(run)


cancel_jobs, pause_jobs, resume_jobs, retry_jobs = map(
    _bulk, ("cancel", "pause", "resume", "retry")
)


class LiveMachineFilter(admin.SimpleListFilter):
    """Jobs holding a rented machine now (the dashboard's "live cloud machines" link here)."""

    title = "rented machine"
    parameter_name = "machine"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[TrainingJob]
    ) -> list[tuple[str, str]]:
        return [("live", "live now")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[TrainingJob]
    ) -> QuerySet[TrainingJob]:
        if self.value() == "live":
            return queryset.filter(pk__in=dashboard.live_machines().values("job_id"))
        return queryset


def _short_time(value: Any) -> str:
    if value is None:
        return NONE
    local = timezone.localtime(value)
    fmt = "%H:%M" if local.date() == timezone.localdate() else "%m-%d %H:%M"
    return format_html('<span title="{}">{}</span>', local.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       local.strftime(fmt))  # fmt: skip


def _truncated(text: str, chars: int) -> str:
    if not text:
        return NONE
    short = Truncator(text).chars(chars)
    if short == text:
        return format_html("{}", text)
    return format_html('<span title="{}">{}</span>', text, short)


@admin.register(TrainingJob)
class TrainingJobAdmin(ModelAdmin[TrainingJob]):
    change_list_template = "admin/jobs/wide_change_list.html"
    list_display = (
        "job",
        "colored_status",
        "where",
        "progress",
        "cost_so_far",
        "waiting",
        "project",
        "created",
    )
    list_filter = ("status", "target", LiveMachineFilter, "project")
    search_fields = ("public_id", "model", "suffix", "project__slug")
    list_display_links = None  # the job column links, with its model beneath
    list_select_related = ("project",)
    list_per_page = 50
    actions = [cancel_jobs, pause_jobs, resume_jobs, retry_jobs]

    class Media:
        css = {"all": ["jobs/admin.css"]}  # the list's compact columns, the job page

    # Operators may reprioritise a queued job; everything else goes through the services.
    readonly_fields = [f.name for f in TrainingJob._meta.fields if f.name != "priority"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        names = [f.name for f in TrainingJob._meta.fields if f.name not in ("id", "priority")]
        raw = [n for n in names if n not in REQUEST_FIELDS]
        return [
            (None, {"fields": ["priority"]}),
            ("Request", {"classes": ["collapse"], "fields": list(REQUEST_FIELDS)}),
            ("Raw state (latest metrics, counters)", {"classes": ["collapse"], "fields": raw}),
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[TrainingJob]:
        return queries.with_attempts(super().get_queryset(request))

    # --- list columns ---------------------------------------------------------------------

    @admin.display(description="job / model", ordering="pk")
    def job(self, obj: TrainingJob) -> str:
        return format_html(
            '<a href="{}">{}</a><div class="th-sub">{}</div>',
            reverse("admin:jobs_trainingjob_change", args=[obj.pk]),
            _truncated(obj.public_id, 16),
            _truncated(obj.model, 24),
        )

    @admin.display(description="status", ordering="status")
    def colored_status(self, obj: TrainingJob) -> str:
        return colored(obj.status)

    @admin.display(description="node / provider")
    def where(self, obj: TrainingJob) -> str:
        attempts = queries.attempts_of(obj)
        found = queries.place(attempts[0] if attempts else None)
        if found is None:
            return format_html('<span class="quiet">{}</span>', obj.target)
        return _truncated(found.short(), 22)

    @admin.display(description="progress")
    def progress(self, obj: TrainingJob) -> str:
        done = queries.progress(obj)
        return done.compact() if done is not None else NONE

    @admin.display(description="cost", ordering="cost")
    def cost_so_far(self, obj: TrainingJob) -> str:
        value = queries.job_cost_so_far(obj, queries.attempts_of(obj), timezone.now())
        return f"${value:.2f}" if value is not None else NONE

    @admin.display(description="waiting reason")
    def waiting(self, obj: TrainingJob) -> str:
        return _truncated(queries.waiting_reason(obj), 40)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: TrainingJob) -> str:
        return _short_time(obj.created_at)

    # --- the job page ---------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/log/", wrap(self.log_view), name="jobs_trainingjob_log"),
            path(
                "<path:object_id>/do/<str:action>/",
                wrap(self.action_view),
                name="jobs_trainingjob_action",
            ),
            *super().get_urls(),
        ]

    def _job_or_404(self, request: HttpRequest, object_id: str) -> TrainingJob:
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404("No such job.")
        return job

    def action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """A job page's button: POST only (with the CSRF token the admin checks); Cancel shows
        a confirmation page first. The service decides whether the job's status allows it."""
        chosen = _actions().get(action)
        if chosen is None:
            raise Http404("No such job action.")
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self._job_or_404(request, object_id)
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        page = reverse("admin:jobs_trainingjob_change", args=[job.pk])
        if chosen.confirm and request.POST.get("confirm") != "yes":
            return TemplateResponse(
                request,
                "admin/jobs/trainingjob/action_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "opts": self.opts,
                    "job": job,
                    "action": chosen,
                    "place": queries.place(queries.live_attempt(queries.attempts_of(job))),
                    "title": f"{chosen.label} job {job.public_id}?",
                    "job_url": page,
                },
            )
        run_job_action(
            self, request, TrainingJob.objects.filter(pk=job.pk), chosen.service, chosen.verb
        )
        return redirect(page)

    def log_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The executor's log lines (``log`` events): the latest N, of one attempt or all."""
        job = self._job_or_404(request, object_id)
        if not self.has_view_permission(request, job):
            raise PermissionDenied
        attempts = queries.log_attempts(job)
        raw_attempt = request.GET.get("attempt", "")
        if raw_attempt == "all":
            attempt = None
        elif raw_attempt.isascii() and raw_attempt.isdigit() and len(raw_attempt) < 6:
            attempt = int(raw_attempt)
        else:  # the newest attempt that logged anything
            attempt = max((a for a in attempts if a > 0), default=None)
        raw_lines = request.GET.get("lines", "")
        limit = int(raw_lines) if raw_lines in {str(n) for n in queries.LOG_LINES} else 1000
        return TemplateResponse(
            request,
            "admin/jobs/trainingjob/log.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "original": job,
                "job": job,
                "title": f"Log of {job.public_id}",
                "lines": queries.log_lines(job, attempt=attempt, limit=limit),
                "attempts": attempts,
                "attempt": attempt,
                "limit": limit,
                "limits": queries.LOG_LINES,
                "job_url": reverse("admin:jobs_trainingjob_change", args=[job.pk]),
            },
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if job is not None:
            extra["job_page"] = self.job_page(request, job)
        return super().change_view(request, object_id, form_url, extra)

    def job_page(self, request: HttpRequest, job: TrainingJob) -> dict[str, Any]:
        """What the job page shows above the raw fields."""
        now = timezone.now()
        attempts = queries.attempts_of(job)
        live = queries.live_attempt(attempts)
        done = queries.progress(job)
        series = queries.metric_series(job)
        event_filter = queries.EventFilter.from_query(request.GET)
        events = queries.events_page(job, event_filter)
        log_attempt = (
            live.number if live is not None else (attempts[0].number if attempts else None)
        )
        base = reverse("admin:jobs_trainingjob_change", args=[job.pk])
        actions = _actions()

        def events_url(**changes: Any) -> str:
            query = event_filter.query(**changes)
            return f"{base}?{urlencode(query)}#events" if query else f"{base}#events"

        return {
            "status_color": STATUS_COLORS.get(job.status, "#24292f"),
            "progress": done,
            "eta": queries.eta(job),
            "throughput": queries.throughput(job),
            "place": queries.place(live or (attempts[0] if attempts else None)),
            "live": live is not None,
            "cost": queries.job_cost_so_far(job, attempts, now),
            "estimated_cost": job.estimated_cost,
            "rate": queries.price_per_hour(attempts),
            "attempts_used": queries.attempts_used(job, attempts),
            "waiting_reason": queries.waiting_reason(job),
            "attempts": [
                {
                    "a": a,
                    "place": queries.place(a),
                    "cost": queries.attempt_cost_so_far(a, now),
                    "rate": queries.costs.attempt_rate(a),
                }
                for a in attempts
            ],
            "actions": [actions[name] for name in queries.valid_actions(job.status)],
            "charts": mark_safe(  # noqa: S308 - charts escapes every text it draws
                charts.training_charts(
                    loss=series.loss,
                    eval_loss=series.eval_loss,
                    lr=series.lr,
                    eval_score=series.eval_score,
                    total_steps=series.total_steps or (done.total if done else None),
                )
            ),
            "metrics_events": series.events,
            "events": events,
            "event_filter": event_filter,
            "event_types": queries.ADMIN_EVENT_TYPES,
            "event_levels": queries.LEVELS,
            "hidden_types": ", ".join(queries.HIDDEN_BY_DEFAULT),
            "older_url": events_url(ev_before=events.older, ev_after=None) if events.older else "",
            "newer_url": events_url(ev_after=events.newer, ev_before=None) if events.newer else "",
            "newest_url": events_url(ev_after=None, ev_before=None)
            if (event_filter.before or event_filter.after)
            else "",
            "log_tail": queries.log_lines(job, attempt=log_attempt, limit=queries.LOG_TAIL)
            if log_attempt is not None
            else queries.log_lines(job, attempt=None, limit=queries.LOG_TAIL),
            "log_attempt": log_attempt,
            "log_url": reverse("admin:jobs_trainingjob_log", args=[job.pk]),
        }

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are created through the API, which validates them

    def save_model(self, request: HttpRequest, obj: TrainingJob, form: Any, change: bool) -> None:
        # Priority is the one editable field; the service checks and records it.
        if change and "priority" in form.changed_data:
            job_services.job_set_priority(
                job=obj, priority=obj.priority, actor=admin_actor(request)
            )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A finished job only (a live one is cancelled first), through the service, which
        # forgets its stored files and records who deleted it.
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or obj.status in TERMINAL)

    def delete_model(self, request: HttpRequest, obj: TrainingJob) -> None:
        job_services.job_delete(job=obj, actor=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TrainingJob]) -> None:
        # "Delete selected", after Django's confirmation page, which refuses a selection with
        # a live job in it (has_delete_permission per object).
        for job in queryset:
            job_services.job_delete(job=job, actor=admin_actor(request))
