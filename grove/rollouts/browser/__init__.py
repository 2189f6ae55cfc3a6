"""Browser tasks: a site served inside the agent's sandbox, a screen with Chromium open at the task's
``start_url``, a scripted policy that acts through the computer API, and a judge for open-ended tasks.

- :mod:`.site`: before the agent, the task's ``serve`` command started in the background, its port waited for,
  the screen opened at ``start_url`` (all inside the setup bracket of the trajectory);
- :mod:`.layout` and :mod:`.policy`: the scripted browser policy (``--harness scripted`` on a browser task): it
  finds its targets in the page's own report of its elements' boxes, then clicks, types, scrolls and drags
  through ``sandbox.computer`` with screen coordinates;
- :mod:`.judge`: ``check.judge``, ``function(trajectory, final_screenshot) -> reward``, run on the runner's side
  and recorded as a grading step.
"""
