-- depends: 0009_context_call_costs
-- A pinned talent is always served to the roles it is for, whatever the task (a Cursor rule with
-- `alwaysApply: true`): exempt from relevance, the gate and the margin, counted in the budget.
ALTER TABLE talents ADD COLUMN pinned boolean NOT NULL DEFAULT false;
