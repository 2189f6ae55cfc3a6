"""The GUI demo (``python -m grove.demo --gui``): offline web tasks in browser sandboxes, a scripted browser
policy, BAR groups, graded in place or by a judge."""
