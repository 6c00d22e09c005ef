"""Memory planning: where every buffer of a schedule lives inside one arena.

`memory_plan` lists the buffers a schedule allocates and places them by best fit (`best_fit`
holds the compiled loop); `addresses.place` is the placement both `remat plan` and the MODeL
solver call (best fit in many orders, ruin and recreate, squeaky wheel, then MODeL's exact
address model, §4.3); `check` verifies any plan independently of the planner that made it.
The modules are imported where they are used (no re-exports here), so that a command which
places no buffer loads neither numba nor OR-Tools.
"""
