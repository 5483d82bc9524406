"""Projects and who may do what in them (issue 27).

- ``grammar``: the documented condition grammar (version 2.0): parse and evaluate;
- ``conditions``: the conditions that keep a role assignment to one project;
- ``roles``: submitter, viewer, operator as role assignments (``Grant``);
- ``assignments``: grant, list and revoke through azure-mgmt-authorization, or a local file;
- ``caller``: who runs the command, and whether they may write a path (the operator check);
- ``tags``: the blob index tags on what upwell writes for a job;
- ``principal``: who is asking the API and the dashboard (``X-MS-CLIENT-PRINCIPAL``) and their projects.

Loading the package imports none of them.
"""
