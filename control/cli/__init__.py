"""The `batchpilot` command (its own process; it talks to a server over HTTP).

    main.py       the entry point and `batchpilot serve`; the other subcommands' parsers
                  live with what they drive (trace/, loadtest/, checklist/)
    ctl.py        `batchpilot ctl` over the control API, ctl_format.py its text output
    dashboard.py  `batchpilot dashboard`: launches the Streamlit app
    http_json.py  the one stdlib JSON HTTP client the CLIs share
"""
