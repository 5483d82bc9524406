"""No timer runs on start-up (issue 23, item 7).

On Flex Consumption every instance that the platform scales out starts the host,
and a timer with ``runOnStartup`` fires on each of them: the scale pass and the
reconciler would run once per new instance, not once per schedule. Azure's
guidance for the timer trigger ("runOnStartup ... should rarely if ever be set
to true, especially in production") is followed: every timer is schedule-only.
"""

from __future__ import annotations


def test_no_timer_of_the_function_app_runs_on_startup():
    import function_app
    from upwell.local.devhost.app import load_functions

    # load_functions caches per app: FunctionApp.get_functions() may run only once per app.
    timers = {s.name: s.trigger for s in load_functions(function_app.app) if s.trigger_type == "timerTrigger"}
    assert {"scale", "reconcile", "janitor"} <= set(timers)  # the metadata is read, not an empty list
    assert {name: t.get("runOnStartup", False) for name, t in timers.items()} == dict.fromkeys(timers, False)
