//! Table tests of the create protocol and the snapshot image rule (`cocoonset.md` §7).

use cocoon_api::naming::Role;

use super::rules::{self, CreateDecision, CreateFacts, TagRead};

#[test]
fn create_protocol_table() {
    let present = |img: &str| TagRead::Present {
        base_image: img.into(),
    };
    let f = |role: Role, tag: TagRead, recorded: bool, owed: bool, cr: bool, uncond: bool| {
        CreateFacts {
            role,
            image: "img:1",
            tag,
            recorded,
            owed_restore: owed,
            cr_restorable: cr,
            unconditional_intent: uncond,
        }
    };
    let fresh = CreateDecision::default();
    let drop = CreateDecision {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    let restore = CreateDecision {
        restore: true,
        ..CreateDecision::default()
    };
    let cases = [
        (
            "no tag: nothing to do",
            f(Role::Main, TagRead::Absent, false, false, false, false),
            fresh,
        ),
        (
            "static toolbox skips the registry",
            f(Role::Toolbox, TagRead::Skipped, true, true, true, true),
            fresh,
        ),
        (
            "image rule: other image",
            f(Role::Main, present("img:0"), true, true, false, false),
            drop,
        ),
        (
            "image rule wins over unconditional intent",
            f(Role::Main, present("img:0"), false, false, false, true),
            drop,
        ),
        (
            "same image, owed restore",
            f(Role::Main, present("img:1"), true, true, false, false),
            restore,
        ),
        (
            "unrecorded base image, CR-restorable",
            f(Role::Toolbox, present(""), false, false, true, false),
            restore,
        ),
        (
            "main with a tag but no intent",
            f(Role::Main, present("img:1"), false, false, false, false),
            fresh,
        ),
        (
            "unconditional intent (6A.1)",
            f(Role::Main, present(""), false, false, false, true),
            restore,
        ),
        (
            "sub-agent pre-create drop",
            f(Role::SubAgent, present("img:1"), true, false, false, false),
            drop,
        ),
        (
            "sub-agent owed a restore",
            f(Role::SubAgent, present("img:1"), true, true, false, false),
            restore,
        ),
        (
            "sub-agent restorable by a CR",
            f(Role::SubAgent, present("img:1"), true, false, true, false),
            restore,
        ),
        (
            "unrecorded sub-agent tag (choice: restore)",
            f(Role::SubAgent, present("img:1"), false, false, false, false),
            restore,
        ),
    ];
    for (what, facts, want) in cases {
        assert_eq!(rules::decide(&facts), want, "{what}");
    }
}

#[test]
fn a_recreate_boots_fresh_without_a_snapshot_or_when_the_image_rule_dropped_it() {
    let present = TagRead::Present {
        base_image: "img:1".into(),
    };
    assert!(rules::wake_boots_fresh(
        &TagRead::Absent,
        &CreateDecision::default()
    ));
    assert!(!rules::wake_boots_fresh(
        &present,
        &CreateDecision::default()
    ));
    let dropped = CreateDecision {
        drop_tag: true,
        forget: true,
        restore: false,
    };
    assert!(rules::wake_boots_fresh(&present, &dropped));
}
