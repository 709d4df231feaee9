"""The reference engine in one process, for `ninelives sim`: its worker and sender classes as
scheduled threads, its stores and HTTP on the virtual clock (`run`), the nemesis that acts on
its store (`nemesis`), and the patches that make its broken variants (`patches`)."""
