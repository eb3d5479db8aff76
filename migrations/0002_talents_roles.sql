-- depends: 0001_initial
-- Talents: the roles that asked a project for talents, so the doctor knows which roles a
-- project's agents use (with the request's and the configured ones).

CREATE TABLE talent_project_roles (
    project_id text NOT NULL,
    role       text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, role)
);
