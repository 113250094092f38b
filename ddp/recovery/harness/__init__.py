"""Running and judging live jobs on this host: the processes of a job with a fault injected
(``local`` for the demo program, ``launch`` for any script on the API), the fault campaign and
its judge (``campaign``, ``audit``), the five-fault run (``endurance``) and the per-step cost
without faults (``bench``). A client of the library like any user: nothing in
``ddp.recovery``'s protocol or API imports from here.
"""
