"""The flight recorder and the diagnosis of a failed collective: every rank records its
collectives (``recorder``), dumps them on failure (``dumps``), and one reader turns the dumps
and gloo's error text (``gloo_errors``) into a verdict such as "rank 2 never joined allreduce
#41" (``diagnosis``)."""
