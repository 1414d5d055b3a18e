"""The control plane: read and steer the live engine (event loop; changes are installed on
the engine thread between two steps, so each applies from the next step).

    routes.py        /control/config, profiles, rollback, history, drain and resume
    config_store.py  the live config's versions: validate, install, audit
    config_watch.py  the serving YAML, reloaded on edit or SIGHUP
    auth.py          bearer tokens with read/admin scopes
"""
