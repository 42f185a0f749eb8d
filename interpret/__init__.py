"""Looking inside a policy.

* :mod:`.trace`: per-step traces of a drive, stored as :mod:`.archive` files in
  :mod:`.chunks` folders;
* :mod:`.saliency`, :mod:`.policy_saliency`: Grad-CAM saliency;
* :mod:`.dashboard` (with :mod:`.explain_report`): the offline HTML dashboard;
  :mod:`.live_view`: the live Rerun view;
* what ``nac-drive explain`` measures: :mod:`.fig4` and :mod:`.road_scenes` (the paper's
  Fig. 4 claim), :mod:`.neuron_atlas`, :mod:`.faithfulness`, :mod:`.temporal_attribution`,
  :mod:`.mirror`, :mod:`.road_share`, :mod:`.representations`, :mod:`.probes`,
  :mod:`.probe_steering`, :mod:`.dictionary`.
"""
